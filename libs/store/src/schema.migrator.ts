/**
 * Applies the SQL files of `migrations/` in order, each in its own transaction
 * with its row in `schema_migrations`. Runs under an exclusive lock so that
 * several replicas starting at once apply each migration exactly once; the
 * others wait, then find nothing left to do.
 */
import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import type { SqlDatabase } from './database/sql-database.js';

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
  const pending = migrations ?? (await loadMigrations());
  return database.withExclusiveLock(LOCK_NAME, async (session) => {
    // Created under the lock: concurrent CREATE TABLE IF NOT EXISTS can still collide.
    await session.query(`
      CREATE TABLE IF NOT EXISTS schema_migrations (
        name text PRIMARY KEY,
        checksum text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now()
      )`);
    const { rows } = await session.query<{ name: string; checksum: string }>(
      'SELECT name, checksum FROM schema_migrations',
    );
    const applied = new Map(rows.map((row) => [row.name, row.checksum]));
    const done: string[] = [];
    for (const migration of pending) {
      const checksum = applied.get(migration.name);
      if (checksum !== undefined) {
        // An applied migration is history: a change to it would never reach existing databases.
        if (checksum !== migration.checksum) {
          throw new Error(
            `migration ${migration.name} changed after it was applied; add a new migration instead`,
          );
        }
        continue;
      }
      await session.transaction(async (tx) => {
        await tx.exec(migration.sql);
        await tx.query('INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)', [
          migration.name,
          migration.checksum,
        ]);
      });
      done.push(migration.name);
    }
    return done;
  });
}
