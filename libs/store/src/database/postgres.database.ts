/** `SqlDatabase` on a `pg.Pool`: the cluster's Postgres, or any server given by `DATABASE_URL`. */
import pg from 'pg';
import type { CustomTypesConfig, PoolClient } from 'pg';
import type { SqlDatabase, SqlResult, SqlSession, SqlTransaction } from './sql-database.js';
import { INT8_OID, parseInt8 } from './sql-database.js';

export interface PostgresOptions {
  /** Connections in the pool (default 10). */
  poolSize?: number;
  /** Errors of idle pooled connections (a server restart, say); ignored when absent. */
  onIdleError?: (error: Error) => void;
}

// Per-pool parsers rather than pg.types.setTypeParser: other code in the
// process may share the pg module and expect its defaults.
function getTypeParser(oid: number, format?: 'text' | 'binary'): (value: string) => unknown {
  if (oid === INT8_OID && format !== 'binary') return parseInt8;
  return pg.types.getTypeParser(oid, format ?? 'text') as (value: string) => unknown;
}
const types: CustomTypesConfig = { getTypeParser };

export function openPostgres(url: string, options: PostgresOptions = {}): SqlDatabase {
  const pool = new pg.Pool({
    connectionString: url,
    max: options.poolSize ?? 10,
    types,
  });
  // Without a listener an idle connection's error would crash the process;
  // the next query reconnects.
  pool.on('error', (error) => options.onIdleError?.(error));
  return new PostgresDatabase(pool);
}

async function run<T>(target: pg.Pool | PoolClient, sql: string, params?: readonly unknown[]) {
  const result = await target.query(sql, params as unknown[] | undefined);
  return { rows: result.rows as T[], rowCount: result.rowCount ?? 0 } satisfies SqlResult<T>;
}

class PostgresDatabase implements SqlDatabase {
  readonly backend = 'postgres' as const;

  constructor(private readonly pool: pg.Pool) {}

  query<T>(sql: string, params?: readonly unknown[]): Promise<SqlResult<T>> {
    return run<T>(this.pool, sql, params);
  }

  async transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      const result = await inTransaction(client, fn);
      client.release();
      return result;
    } catch (error) {
      // A client whose ROLLBACK failed may be mid-transaction: destroy it.
      client.release(error instanceof RollbackFailedError);
      throw error instanceof RollbackFailedError ? error.original : error;
    }
  }

  async withExclusiveLock<T>(name: string, fn: (session: SqlSession) => Promise<T>): Promise<T> {
    // A dedicated connection: a session-level advisory lock belongs to it.
    const client = await this.pool.connect();
    let healthy = true;
    try {
      await client.query('SELECT pg_advisory_lock(hashtext($1))', [name]);
      try {
        return await fn(new ClientSession(client));
      } finally {
        await client.query('SELECT pg_advisory_unlock(hashtext($1))', [name]);
      }
    } catch (error) {
      healthy = false;
      throw error;
    } finally {
      // Destroying a connection after a failure also drops any lock it held.
      client.release(!healthy);
    }
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}

class ClientSession implements SqlSession {
  constructor(private readonly client: PoolClient) {}

  query<T>(sql: string, params?: readonly unknown[]): Promise<SqlResult<T>> {
    return run<T>(this.client, sql, params);
  }

  async transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T> {
    try {
      return await inTransaction(this.client, fn);
    } catch (error) {
      throw error instanceof RollbackFailedError ? error.original : error;
    }
  }
}

class RollbackFailedError extends Error {
  constructor(readonly original: unknown) {
    super('ROLLBACK failed');
  }
}

async function inTransaction<T>(
  client: PoolClient,
  fn: (tx: SqlTransaction) => Promise<T>,
): Promise<T> {
  const tx: SqlTransaction = {
    query: <R>(sql: string, params?: readonly unknown[]) => run<R>(client, sql, params),
    async exec(script: string) {
      // Without parameters pg uses the simple protocol, which runs several statements.
      await client.query(script);
    },
  };
  await client.query('BEGIN');
  let result: T;
  try {
    result = await fn(tx);
  } catch (error) {
    try {
      await client.query('ROLLBACK');
    } catch {
      throw new RollbackFailedError(error);
    }
    throw error;
  }
  await client.query('COMMIT');
  return result;
}
