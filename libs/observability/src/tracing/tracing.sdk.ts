/**
 * The OpenTelemetry SDK of a process, started by `tracing.register.ts` when
 * OTEL_EXPORTER_OTLP_ENDPOINT is set: traces over OTLP/HTTP (JSON) with the
 * instrumentations of http, pg, ioredis and socket.io, as `service.name`
 * conversation-service with `service.role` gateway, worker or standalone.
 */
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { HttpInstrumentation } from '@opentelemetry/instrumentation-http';
import { IORedisInstrumentation } from '@opentelemetry/instrumentation-ioredis';
import { PgInstrumentation } from '@opentelemetry/instrumentation-pg';
import { SocketIoInstrumentation } from '@opentelemetry/instrumentation-socket.io';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { NodeSDK } from '@opentelemetry/sdk-node';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { setTracingStopper } from './tracing-shutdown.js';

export const SERVICE_NAME = 'conversation-service';

/** Paths whose requests make no span: probes and scrapes would drown the traces. */
const UNTRACED_PATHS = new Set(['/healthz', '/readyz', '/metrics']);

let sdk: NodeSDK | undefined;

export function startTracingSdk(options: { endpoint: string; role: string }): void {
  if (sdk) return;
  const exporter = new OTLPTraceExporter({
    url: `${options.endpoint.replace(/\/+$/, '')}/v1/traces`,
  });
  sdk = new NodeSDK({
    resource: resourceFromAttributes({
      'service.name': SERVICE_NAME,
      'service.role': options.role,
    }),
    spanProcessors: [new BatchSpanProcessor(exporter, { scheduledDelayMillis: 500 })],
    instrumentations: [
      new HttpInstrumentation({
        ignoreIncomingRequestHook: (request) =>
          UNTRACED_PATHS.has((request.url ?? '').split('?')[0] ?? ''),
        // The collector's own endpoint: exporting must not trace itself.
        ignoreOutgoingRequestHook: (request) => (request.path ?? '').startsWith('/v1/traces'),
      }),
      new PgInstrumentation({ requireParentSpan: true }),
      new IORedisInstrumentation({ requireParentSpan: true }),
      new SocketIoInstrumentation(),
    ],
  });
  sdk.start();
  const running = sdk;
  setTracingStopper(() => running.shutdown());
}
