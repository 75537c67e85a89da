#!/usr/bin/env node
// Builds every app and lib into dist/ with the Nest CLI, then copies the
// non-TypeScript assets (SQL migrations, Lua scripts). tsconfig.build.json
// includes all apps and libs, so one compile builds them all. Then the client
// SDK (libs/client, its own package: tsc to libs/client/dist/) and the web app
// (web/, Vite to dist/web/, served at `/`).
// `--if-needed` skips the compile when dist/ is newer than every source file.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundleApps } from './bundle-apps.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const entries = [
  ...['standalone', 'gateway', 'worker', 'migrate'].map((app) =>
    join(root, 'dist', 'apps', app, 'src', 'main.js'),
  ),
  join(root, 'libs', 'client', 'dist', 'index.js'),
  join(root, 'dist', 'web', 'index.html'),
];
const stamp = join(root, 'dist', '.build-stamp');

/** Files whose change calls for a rebuild. */
function* sources(dir) {
  for (const name of readdirSync(dir)) {
    if (name === 'node_modules' || name === 'dist') continue;
    const path = join(dir, name);
    const stat = statSync(path);
    if (stat.isDirectory()) yield* sources(path);
    else yield { path, mtimeMs: stat.mtimeMs };
  }
}

function upToDate() {
  if (!existsSync(stamp) || !entries.every((entry) => existsSync(entry))) return false;
  const built = statSync(stamp).mtimeMs;
  const inputs = [join(root, 'apps'), join(root, 'libs'), join(root, 'web')];
  for (const dir of inputs) for (const file of sources(dir)) if (file.mtimeMs > built) return false;
  for (const file of ['tsconfig.json', 'tsconfig.build.json', 'package-lock.json']) {
    const path = join(root, file);
    if (existsSync(path) && statSync(path).mtimeMs > built) return false;
  }
  return true;
}

if (process.argv.includes('--if-needed') && upToDate()) process.exit(0);

const started = Date.now();
process.stdout.write('building dist/ … ');
const nest = join(root, 'node_modules', '.bin', 'nest');
if (!existsSync(nest)) {
  process.stderr.write('\nthe build tools are missing: run `npm install` first\n');
  process.exit(1);
}
// A whole compile: nothing a source no longer makes (a moved or deleted file) stays behind.
for (const dir of ['apps', 'libs'])
  rmSync(join(root, 'dist', dir), { recursive: true, force: true });
const result = spawnSync(nest, ['build', 'standalone'], { cwd: root, stdio: 'inherit' });
if (result.status !== 0) process.exit(result.status ?? 1);
await bundleApps(root, ['standalone', 'gateway', 'worker', 'migrate']);

const bin = (name) => join(root, 'node_modules', '.bin', name);
rmSync(join(root, 'libs', 'client', 'dist'), { recursive: true, force: true });
const client = spawnSync(bin('tsc'), ['-p', 'libs/client/tsconfig.build.json'], {
  cwd: root,
  stdio: 'inherit',
});
if (client.status !== 0) process.exit(client.status ?? 1);
const web = spawnSync(
  bin('vite'),
  ['build', '--config', 'web/vite.config.ts', '--logLevel', 'warn'],
  { cwd: root, stdio: 'inherit' },
);
if (web.status !== 0) process.exit(web.status ?? 1);

const assets = [
  ['libs/store/src/migrations', 'dist/libs/store/src/migrations'],
  ['libs/cluster/src/lua', 'dist/libs/cluster/src/lua'],
];
for (const [from, to] of assets) {
  if (existsSync(join(root, from))) cpSync(join(root, from), join(root, to), { recursive: true });
}
cpSync(join(root, 'package.json'), stamp);
process.stdout.write(`done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
