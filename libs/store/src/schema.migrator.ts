/**
 * Applies the SQL files of `migrations/` in order, each in its own transaction
 * with its row in `schema_migrations`. Each of those transactions holds a
 * transaction-level advisory lock and checks again that its migration is
 * still pending, so that several replicas starting at once apply each
 * migration exactly once (the others wait, then find it done), with no
 * session state: it runs through PgBouncer in transaction mode.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import type { SqlDatabase, SqlTransaction } from './database/sql-database.js';

export interface Migration {
  /** The file name without `.sql`, e.g. `0001_initial`. */
  name: string;
  sql: string;
  checksum: string;
}

/** Beside this module in the sources and in dist/ (scripts/build.mjs copies it). */
export const MIGRATIONS_DIR = new URL('./migrations/', import.meta.url);

const MIGRATION_FILE = /^(\d{4})_[a-z0-9_]+\.sql$/;
const LOCK_NAME = 'conversation-service:schema_migrations';

export async function loadMigrations(dir: URL = MIGRATIONS_DIR): Promise<Migration[]> {
  const files = (await readdir(dir)).filter((file) => MIGRATION_FILE.test(file)).sort();
  const migrations: Migration[] = [];
  const numbers = new Set<string>();
  for (const file of files) {
    const number = file.slice(0, 4);
    if (numbers.has(number)) throw new Error(`two migrations are numbered ${number}`);
    numbers.add(number);
    const sql = await readFile(new URL(file, dir), 'utf8');
    migrations.push({
      name: file.slice(0, -'.sql'.length),
      sql,
      checksum: createHash('sha256').update(sql).digest('hex'),
    });
  }
  return migrations;
}

/** Applies the migrations not yet applied; returns their names in order. */
export async function migrate(
  database: SqlDatabase,
  migrations?: readonly Migration[],
): Promise<string[]> {
  const all = migrations ?? (await loadMigrations());
  // A first look, which in the common case finds nothing to do.
  const pending = await database.transaction(async (tx) => {
    await lockMigrations(tx);
    // Created under the lock: concurrent CREATE TABLE IF NOT EXISTS can still collide.
    await tx.query(`
      CREATE TABLE IF NOT EXISTS schema_migrations (
        name text PRIMARY KEY,
        checksum text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
      )`);
    const { rows } = await tx.query<{ name: string; checksum: string }>(
      'SELECT name, checksum FROM schema_migrations',
    );
    const applied = new Map(rows.map((row) => [row.name, row.checksum]));
    return all.filter((migration) => {
      const checksum = applied.get(migration.name);
      if (checksum === undefined) return true;
      // An applied migration is history: a change to it would never reach existing databases.
      if (checksum !== migration.checksum) {
        throw new Error(
          `migration ${migration.name} changed after it was applied; add a new migration instead`,
        );
      }
      return false;
    });
  });
  const done: string[] = [];
  for (const migration of pending) {
    const applied = await database.transaction(async (tx) => {
      await lockMigrations(tx);
      // Another migrator may have applied it since the first look.
      const { rows } = await tx.query('SELECT 1 FROM schema_migrations WHERE name = $1', [
        migration.name,
      ]);
      if (rows.length > 0) return false;
      await tx.exec(migration.sql);
      await tx.query('INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)', [
        migration.name,
        migration.checksum,
      ]);
      return true;
    });
    if (applied) done.push(migration.name);
  }
  return done;
}

/**
 * Held until the transaction ends, so that it needs no session of its own:
 * a session-level lock would stay with whichever server connection a pooler
 * in transaction mode (PgBouncer) lent for the statement. On PGlite, one
 * session, it excludes nothing, and needs not: its transactions run one
 * after another.
 */
async function lockMigrations(tx: SqlTransaction): Promise<void> {
  await tx.query('SELECT pg_advisory_xact_lock(hashtext($1))', [LOCK_NAME]);
}
