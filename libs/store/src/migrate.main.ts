/**
 * `npm run db:migrate`: applies pending migrations to `DATABASE_URL`, or else
 * to the embedded database in `DATA_DIR`, and says what it did.
 */
import { loadConfigOrExit } from '@cs/config';
import { DataDirLockedError } from './database/data-dir.lock.js';
import { openEmbeddedDatabase } from './database/embedded.database.js';
import { openPostgres } from './database/postgres.database.js';
import { migrate } from './schema.migrator.js';

async function main(): Promise<void> {
  const config = loadConfigOrExit('tool');
  const { url, dataDir } = config.database;
  const target = url ? `Postgres at ${redact(url)}` : `the embedded database in ${dataDir}`;
  const database = url ? openPostgres(url, { poolSize: 1 }) : await openEmbeddedDatabase(dataDir);
  try {
    const applied = await migrate(database);
    if (applied.length === 0) process.stdout.write(`${target}: schema up to date\n`);
    for (const name of applied) process.stdout.write(`${target}: applied ${name}\n`);
  } finally {
    await database.close();
  }
}

function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    process.stderr.write(
      error instanceof DataDirLockedError
        ? `${error.message}\n`
        : `migration failed: ${String(error)}\n`,
    );
    process.exit(1);
  },
);
