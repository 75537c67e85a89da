/**
 * `node --import ./dist/libs/observability/src/tracing/tracing.register.js
 * dist/apps/<role>/src/main.js`: with OTEL_EXPORTER_OTLP_ENDPOINT set, installs
 * the ESM loader hook that lets the instrumentations patch what the app
 * imports, then starts the SDK, before the app's first import. Unset, it does
 * nothing (no SDK is even loaded). The role is the app being started.
 */
import { register } from 'node:module';
import { loadConfig } from '@cs/config';

/** Only these are wrapped by the loader hook: the rest load untouched. */
const INSTRUMENTED = ['pg', 'ioredis', 'socket.io', 'http', 'node:http', 'https', 'node:https'];

function endpoint(): string | undefined {
  try {
    return loadConfig('tool').otlpEndpoint;
  } catch {
    return undefined; // the app itself reports a bad configuration
  }
}

/** `gateway`, `worker` or `standalone`, from the path of the entry point. */
export function roleOf(entry: string | undefined): string {
  const match = /apps[\\/]([a-z]+)[\\/]/.exec(entry ?? '');
  return match?.[1] ?? 'tool';
}

const target = endpoint();
if (target) {
  register('@opentelemetry/instrumentation/hook.mjs', import.meta.url, {
    data: { include: INSTRUMENTED },
  });
  const { startTracingSdk } = await import('./tracing.sdk.js');
  startTracingSdk({ endpoint: target, role: roleOf(process.argv[1]) });
}
