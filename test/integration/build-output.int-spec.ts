// What ships: the build (dist/, made by `npm test` before any test) holds no
// test support, and a production install (`npm ci --omit=dev`) no library
// that only the web app's build needs.
import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/processes.js';

function* files(dir: string): Generator<string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* files(path);
    else yield relative(ROOT, path);
  }
}

describe('the shipped build', () => {
  it('holds no test support: no testing/ folder, no fake server, no spec', () => {
    const shipped = [...files(join(ROOT, 'dist'))];
    expect(shipped.some((file) => file.startsWith('dist/apps/'))).toBe(true);
    expect(shipped.filter((file) => /(^|\/)(testing|test)\/|\.spec\.js$|fake-/.test(file))).toEqual(
      [],
    );
  });

  it('installs the web app’s libraries only for development', () => {
    const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
      devDependencies: Record<string, string>;
    };
    for (const name of ['preact', 'marked', 'dompurify']) {
      expect(manifest.dependencies[name], name).toBeUndefined();
      expect(manifest.devDependencies[name], name).toBeDefined();
    }
  });
});
