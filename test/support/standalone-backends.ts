// The two databases a standalone process runs on in the end-to-end files:
// PGlite in its DATA_DIR (a copy of the migrated PGlite folder) and a scratch
// Postgres database (a copy of the migrated template) beside a DATA_DIR.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { standaloneDataDir } from './migrated-template.js';
import { createScratchDatabase } from './services.js';

export interface StandaloneBackend {
  name: 'PGlite' | 'Postgres';
  /** The environment of a standalone on it, and how to remove what it made. */
  env(): Promise<{ env: Record<string, string>; cleanup: () => Promise<void> }>;
}

/** `prefix` names the folders and databases (e.g. `cs-lifecycle`). */
export function standaloneBackends(prefix: string): StandaloneBackend[] {
  return [
    {
      name: 'PGlite',
      async env() {
        const dir = standaloneDataDir(`${prefix}-`);
        return {
          env: { DATA_DIR: dir },
          cleanup: async () => rmSync(dir, { recursive: true, force: true }),
        };
      },
    },
    {
      name: 'Postgres',
      async env() {
        const db = await createScratchDatabase(prefix.replace(/-/g, '_'), { migrated: true });
        const dir = mkdtempSync(join(tmpdir(), `${prefix}-`));
        return {
          env: { DATABASE_URL: db.url, DATA_DIR: dir },
          cleanup: async () => {
            await db.drop();
            rmSync(dir, { recursive: true, force: true });
          },
        };
      },
    },
  ];
}
