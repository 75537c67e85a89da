// The embedded database's folders are private to the process' user (0700),
// also when they existed with looser modes, whatever the umask: PGlite writes
// its own files readable and writable by anyone, so the folders are what
// keeps other users of the host out. The folder is a copy of the migrated
// template (test/support/migrated-template.ts): its files are there, as in a
// folder in use, and no initdb runs.
import { chmodSync, mkdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { openStore } from '@cs/store';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { standaloneDataDir } from '../support/migrated-template.js';

const modeOf = (path: string) => statSync(path).mode & 0o777;

describe('the embedded database folder', () => {
  let dataDir: string;

  beforeEach(() => {
    dataDir = standaloneDataDir('cs-data-modes-');
  });

  afterEach(() => {
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('makes DATA_DIR and its pgdata 0700 when they existed with 0755 and 0777', async () => {
    const pgdata = join(dataDir, 'pgdata');
    mkdirSync(pgdata, { recursive: true });
    chmodSync(dataDir, 0o755);
    chmodSync(pgdata, 0o777);
    const opened = await openStore({ dataDir, migrate: true });
    try {
      expect(modeOf(dataDir)).toBe(0o700);
      expect(modeOf(pgdata)).toBe(0o700);
    } finally {
      await opened.close();
    }
    // And so they stay on the next open, after someone loosened them again.
    chmodSync(dataDir, 0o755);
    const reopened = await openStore({ dataDir, migrate: false });
    try {
      expect(modeOf(dataDir)).toBe(0o700);
      expect(modeOf(pgdata)).toBe(0o700);
    } finally {
      await reopened.close();
    }
  });
});
