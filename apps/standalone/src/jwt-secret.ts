import { randomBytes } from 'node:crypto';
import { chmodSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { makePrivateDir } from '@cs/store';

/** Only the owner may read or write the secret. */
export const JWT_SECRET_FILE_MODE = 0o600;

/**
 * The standalone mode signs development tokens with a secret of its own when
 * `AUTH_JWT_SECRET` is not set: made once, kept in `DATA_DIR`, so that tokens
 * survive a restart. The folder is kept 0700 and the file 0600 whatever they
 * were before (a file written by an older version was 0644, and a write
 * keeps an existing file's mode), independently of the umask.
 */
export function standaloneJwtSecret(dataDir: string): string {
  makePrivateDir(dataDir);
  const path = join(dataDir, 'jwt-secret');
  let existing: string | undefined;
  try {
    existing = readFileSync(path, 'utf8').trim();
  } catch {
    // not made yet
  }
  if (existing !== undefined && existing.length >= 32) {
    chmodSync(path, JWT_SECRET_FILE_MODE);
    return existing;
  }
  const secret = randomBytes(32).toString('hex');
  // A new file, private before it holds the secret, then put in place at once:
  // an old file is replaced, never rewritten with its loose mode.
  const draft = `${path}.${process.pid}.tmp`;
  rmSync(draft, { force: true });
  writeFileSync(draft, `${secret}\n`, { mode: JWT_SECRET_FILE_MODE, flag: 'wx' });
  chmodSync(draft, JWT_SECRET_FILE_MODE);
  renameSync(draft, path);
  return secret;
}
