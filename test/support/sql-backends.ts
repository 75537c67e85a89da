// The databases the Postgres store runs on, for the store's integration
// specs: a scratch Postgres database, the same through PgBouncer in
// transaction mode, and an in-memory PGlite. Each `open()` gives a fresh,
// unmigrated database and its teardown; `open({ migrated: true })` one that
// starts from the migrated template (test/support/migrated-template.ts), for
// the specs that do not test migrating (their `migrate()` then finds nothing
// to do).
import type { SqlDatabase } from '@cs/store';
import { openPglite, openPostgres } from '@cs/store';
import { openMigratedPglite } from './migrated-template.js';
import { startPgBouncer } from './pgbouncer.js';
import { createScratchDatabase } from './services.js';

export interface SqlBackend {
  name: string;
  open(options?: { migrated?: boolean }): Promise<{
    database: SqlDatabase;
    /** Another pool on the same database (another process's view); PGlite has only one. */
    another(): SqlDatabase | null;
    teardown(): Promise<void>;
  }>;
}

export const SQL_BACKENDS: SqlBackend[] = [
  {
    name: 'Postgres',
    async open(options) {
      const scratch = await createScratchDatabase('cs_store', options);
      const database = openPostgres(scratch.url, { poolSize: 24 });
      return {
        database,
        another: () => openPostgres(scratch.url, { poolSize: 10 }),
        async teardown() {
          await database.close();
          await scratch.drop();
        },
      };
    },
  },
  {
    // Nothing prepared, no session state: every statement and transaction may
    // meet another server connection.
    name: 'Postgres through PgBouncer in transaction mode',
    async open(options) {
      const scratch = await createScratchDatabase('cs_store_bouncer', options);
      const bouncer = await startPgBouncer();
      const url = bouncer.urlFor(scratch.url);
      const database = openPostgres(url, { poolSize: 24, preparedStatements: false });
      return {
        database,
        another: () => openPostgres(url, { poolSize: 10, preparedStatements: false }),
        async teardown() {
          await database.close();
          await bouncer.stop();
          await scratch.drop();
        },
      };
    },
  },
  {
    name: 'PGlite',
    async open(options) {
      const database = options?.migrated ? await openMigratedPglite() : await openPglite(undefined);
      return { database, another: () => null, teardown: () => database.close() };
    },
  },
];
