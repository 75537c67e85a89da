import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { standaloneJwtSecret } from './jwt-secret.js';

const modeOf = (path: string) => statSync(path).mode & 0o777;

describe(standaloneJwtSecret.name, () => {
  let root: string;
  let dataDir: string;
  let secretPath: string;
  let umask: number;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'cs-jwt-secret-'));
    dataDir = join(root, 'data');
    secretPath = join(dataDir, 'jwt-secret');
    umask = process.umask();
  });

  afterEach(() => {
    process.umask(umask);
    rmSync(root, { recursive: true, force: true });
  });

  /** A data folder and secret file as an older version left them: 0755 and 0644. */
  function looseDataDir(secret: string): void {
    mkdirSync(dataDir);
    chmodSync(dataDir, 0o755);
    writeFileSync(secretPath, secret);
    chmodSync(secretPath, 0o644);
    expect([modeOf(dataDir), modeOf(secretPath)]).toEqual([0o755, 0o644]);
  }

  it('keeps an existing secret and makes its file 0600 and the folder 0700', () => {
    const kept = 'k'.repeat(64);
    looseDataDir(`${kept}\n`);
    expect(standaloneJwtSecret(dataDir)).toBe(kept);
    expect(modeOf(secretPath)).toBe(0o600);
    expect(modeOf(dataDir)).toBe(0o700);
  });

  it('replaces a secret too short to use with a new one in a 0600 file', () => {
    looseDataDir('short\n');
    const secret = standaloneJwtSecret(dataDir);
    expect(secret).toMatch(/^[0-9a-f]{64}$/);
    expect(readFileSync(secretPath, 'utf8')).toBe(`${secret}\n`);
    expect(modeOf(secretPath)).toBe(0o600);
    expect(modeOf(dataDir)).toBe(0o700);
    // Read back as it is on the next start; nothing else is left in the folder.
    expect(standaloneJwtSecret(dataDir)).toBe(secret);
    expect(readdirSync(dataDir)).toEqual(['jwt-secret']);
  });

  it.each([
    ['000', 0o000],
    ['022', 0o022],
    ['077', 0o077],
    ['277', 0o277],
  ])('makes a new folder 0700 and file 0600 whatever the umask (%s)', (_name, mask) => {
    process.umask(mask);
    const secret = standaloneJwtSecret(dataDir);
    process.umask(umask);
    expect(modeOf(dataDir)).toBe(0o700);
    expect(modeOf(secretPath)).toBe(0o600);
    expect(readFileSync(secretPath, 'utf8').trim()).toBe(secret);
  });
});
