// Bundles each app's entry point (dist/apps/<app>/src/main.js, as tsc wrote
// it) into one file in its place, so that a process starts by reading one
// module instead of ~2,000: Node 20's ESM loader spends most of a start
// resolving, reading and linking files one by one (a gateway: 3.0 s of CPU
// unbundled, 1.6 s bundled, under load). The bundle keeps every behaviour:
// - packages that OpenTelemetry instruments (pg, ioredis, socket.io) and
//   @opentelemetry/* stay outside, loaded from node_modules, so that the
//   tracing hook (`--import …/tracing.register.js`) still sees them;
// - packages that load their own files (PGlite's WebAssembly, pino's worker
//   transports, swagger-ui's assets) or that only some processes load lazily
//   (the model SDKs, the tokenizer, MCP) stay outside too;
// - every `import.meta.url` keeps pointing at its module's own file, so that
//   the migrations, Lua scripts and web assets found next to it are found.
import { builtinModules } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { rolldown } from 'rolldown';

const OUTSIDE = [
  // instrumented by OpenTelemetry, or its API (one copy for the hook and us)
  'pg',
  'pg-native',
  'ioredis',
  'socket.io',
  /^@socket\.io\//,
  /^@opentelemetry\//,
  // load their own files at run time
  /^@electric-sql\/pglite/,
  'pino',
  'pino-pretty',
  'thread-stream',
  'swagger-ui-dist',
  // imported lazily, by the processes that need them
  /^openai(\/|$)/,
  /^@anthropic-ai\//,
  /^gpt-tokenizer(\/|$)/,
  /^@modelcontextprotocol\//,
  // Nest's optional packages, not installed here: looked for at run time
  /^@nestjs\/microservices/,
  /^@nestjs\/platform-fastify/,
  /^@fastify\//,
  'class-validator',
  /^class-transformer/,
];

function outside(id) {
  if (id.startsWith('node:') || builtinModules.includes(id)) return true;
  return OUTSIDE.some((rule) =>
    typeof rule === 'string' ? id === rule || id.startsWith(`${rule}/`) : rule.test(id),
  );
}

const PLUGIN = 'import-meta-url-of-the-module';

/** Bundles `dist/apps/<app>/src/main.js` of each app in place. */
export async function bundleApps(root, apps) {
  for (const app of apps) {
    const main = join(root, 'dist', 'apps', app, 'src', 'main.js');
    const dir = dirname(main);
    const bundle = await rolldown({
      input: main,
      platform: 'node',
      external: outside,
      logLevel: 'warn',
      // The rewrite below keeps every line where it was and shifts columns only
      // on the few lines that hold `import.meta.url`: the source map stays good.
      onLog(level, log, handler) {
        if (log.code === 'SOURCEMAP_BROKEN' && log.plugin === PLUGIN) return;
        handler(level, log);
      },
      plugins: [
        {
          name: PLUGIN,
          transform(code, id) {
            if (!code.includes('import.meta.url')) return null;
            const path = JSON.stringify(relative(dir, id));
            return code.replaceAll('import.meta.url', `new URL(${path}, import.meta.url).href`);
          },
        },
      ],
    });
    // Every input has been read by now: the bundle can take the entry's place.
    await bundle.write({ file: main, format: 'esm', codeSplitting: false, sourcemap: true });
    await bundle.close();
  }
}
