#!/usr/bin/env node
// Sizes that users download, after `npm run build`: the client SDK as a
// bundler would ship it (libs/client/dist with socket.io-client, minified,
// gzipped) and the web app's initial JavaScript (what dist/web/index.html
// loads, gzipped). Prints JSON; exits 1 when a target of issue 13 is missed.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { build } from 'vite';

const root = fileURLToPath(new URL('../..', import.meta.url));
const TARGETS = { sdk: 30 * 1024, app: 120 * 1024 };
const gzipped = (code) => gzipSync(code, { level: 9 }).length;

async function sdkSize() {
  const result = await build({
    configFile: false,
    logLevel: 'silent',
    build: {
      write: false,
      minify: true,
      target: 'es2022',
      lib: { entry: join(root, 'libs/client/dist/index.js'), formats: ['es'], fileName: 'sdk' },
    },
  });
  const outputs = (Array.isArray(result) ? result : [result]).flatMap((r) => r.output);
  const code = outputs
    .filter((o) => o.type === 'chunk')
    .map((o) => o.code)
    .join('\n');
  return { minified: Buffer.byteLength(code), gzipped: gzipped(code) };
}

function appSize() {
  const dir = join(root, 'dist/web');
  const html = readFileSync(join(dir, 'index.html'), 'utf8');
  const scripts = [
    ...html.matchAll(
      /<(?:script[^>]*\ssrc|link[^>]*rel="modulepreload"[^>]*\shref)="([^"]+\.js)"/g,
    ),
  ].map((m) => m[1]);
  const code = scripts.map((src) => readFileSync(join(dir, src.replace(/^\//, '')))).join('\n');
  return { files: scripts, gzipped: gzipped(code) };
}

const sdk = await sdkSize();
const app = appSize();
const report = {
  sdk_minified_bytes: sdk.minified,
  sdk_gzipped_bytes: sdk.gzipped,
  sdk_target_bytes: TARGETS.sdk,
  app_initial_js_gzipped_bytes: app.gzipped,
  app_target_bytes: TARGETS.app,
  app_initial_files: app.files,
};
process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
if (sdk.gzipped > TARGETS.sdk || app.gzipped > TARGETS.app) process.exit(1);
