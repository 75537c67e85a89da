import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The standalone mode signs development tokens with a secret of its own when
 * `AUTH_JWT_SECRET` is not set: made once, kept in `DATA_DIR`, so that tokens
 * survive a restart.
 */
export function standaloneJwtSecret(dataDir: string): string {
  const path = join(dataDir, 'jwt-secret');
  try {
    const existing = readFileSync(path, 'utf8').trim();
    if (existing.length >= 32) return existing;
  } catch {
    // not made yet
  }
  mkdirSync(dataDir, { recursive: true });
  const secret = randomBytes(32).toString('hex');
  writeFileSync(path, `${secret}\n`, { mode: 0o600 });
  return secret;
}
