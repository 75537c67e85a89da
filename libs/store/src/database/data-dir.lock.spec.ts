import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { lockDataDir, makePrivateDir } from './data-dir.lock.js';

const modeOf = (path: string) => statSync(path).mode & 0o777;

describe('data folder modes', () => {
  let root: string;
  let umask: number;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'cs-data-dir-'));
    umask = process.umask();
  });

  afterEach(() => {
    process.umask(umask);
    rmSync(root, { recursive: true, force: true });
  });

  it('locks an existing 0755 (or 0777) data folder and leaves it 0700', async () => {
    for (const loose of [0o755, 0o777]) {
      const dataDir = join(root, `data-${loose.toString(8)}`);
      mkdirSync(dataDir);
      chmodSync(dataDir, loose);
      expect(modeOf(dataDir)).toBe(loose);
      const lock = await lockDataDir(dataDir);
      try {
        expect(modeOf(dataDir)).toBe(0o700);
      } finally {
        await lock.release();
      }
    }
  });

  it.each([
    ['000', 0o000],
    ['022', 0o022],
    ['277', 0o277],
  ])('makes a missing folder 0700 whatever the umask (%s)', (_name, mask) => {
    const dir = join(root, 'a', 'b');
    process.umask(mask);
    makePrivateDir(dir);
    process.umask(umask);
    expect(modeOf(dir)).toBe(0o700);
  });
});
