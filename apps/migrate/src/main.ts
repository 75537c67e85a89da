// `npm run db:migrate`: applies pending migrations to DATABASE_URL, or else to
// the embedded database in DATA_DIR, says what it did (one log line per
// migration) and exits 0, or 1 when it failed. Several at once are safe: each
// migration's transaction holds a Postgres transaction-level advisory lock
// (so it runs through PgBouncer in transaction mode too).
import { runTask } from '@cs/process';
import { migrate, openEmbeddedDatabase, openPostgres } from '@cs/store';

runTask('migrate', async ({ config, logger }) => {
  const { url, dataDir } = config.database;
  const target = url ? `Postgres at ${redactUrl(url)}` : `the embedded database in ${dataDir}`;
  const database = url
    ? openPostgres(url, { poolSize: 1, preparedStatements: config.database.preparedStatements })
    : await openEmbeddedDatabase(dataDir);
  try {
    const applied = await migrate(database);
    if (applied.length === 0) logger.info(`${target}: schema up to date`);
    for (const name of applied) logger.info({ migration: name }, `${target}: applied ${name}`);
  } finally {
    await database.close();
  }
});

/** The URL without its user and password. */
function redactUrl(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}
