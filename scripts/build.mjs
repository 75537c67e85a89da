#!/usr/bin/env node
// Builds every app and lib into dist/ with the Nest CLI, then copies the
// non-TypeScript assets (SQL migrations, the demo page). tsconfig.build.json
// includes all apps and libs, so one compile builds them all.
// `--if-needed` skips the compile when dist/ is newer than every source file.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const entries = ['standalone', 'gateway', 'worker'].map((app) =>
  join(root, 'dist', 'apps', app, 'src', 'main.js'),
);
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
  const inputs = [join(root, 'apps'), join(root, 'libs')];
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
const result = spawnSync(nest, ['build', 'standalone'], { cwd: root, stdio: 'inherit' });
if (result.status !== 0) process.exit(result.status ?? 1);

const assets = [
  ['libs/store/src/migrations', 'dist/libs/store/src/migrations'],
  ['libs/gateway/public', 'dist/libs/gateway/public'],
  ['libs/cluster/src/lua', 'dist/libs/cluster/src/lua'],
];
for (const [from, to] of assets) {
  if (existsSync(join(root, from))) cpSync(join(root, from), join(root, to), { recursive: true });
}
cpSync(join(root, 'package.json'), stamp);
process.stdout.write(`done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
