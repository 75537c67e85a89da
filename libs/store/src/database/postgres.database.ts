/** `SqlDatabase` on a `pg.Pool`: the cluster's Postgres, or any server given by `DATABASE_URL`. */
import { createHash } from 'node:crypto';
import pg from 'pg';
import type { CustomTypesConfig, PoolClient } from 'pg';
import type { QueryOptions, SqlDatabase, SqlResult, SqlTransaction } from './sql-database.js';
import { INT8_OID, parseInt8 } from './sql-database.js';

export interface PostgresOptions {
  /** Connections in the pool (default 10). */
  poolSize?: number;
  /** Errors of idle pooled connections (a server restart, say); ignored when absent. */
  onIdleError?: (error: Error) => void;
  /**
   * Named prepared statements for the hot path (default true). Turn off
   * behind a pooler that cannot keep them (PgBouncer before 1.21 in
   * transaction mode).
   */
  preparedStatements?: boolean;
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
  return new PostgresDatabase(pool, options.preparedStatements ?? true);
}

// pg keeps a named statement prepared per connection; the name must stand for
// one text only, so it is derived from the text.
const statementNames = new Map<string, string>();
function statementName(sql: string): string {
  let name = statementNames.get(sql);
  if (name === undefined) {
    name = `cs_${createHash('sha256').update(sql).digest('hex').slice(0, 24)}`;
    statementNames.set(sql, name);
  }
  return name;
}

type Runner = <T>(
  sql: string,
  params?: readonly unknown[],
  options?: QueryOptions,
) => Promise<SqlResult<T>>;

function runner(target: pg.Pool | PoolClient, prepare: boolean): Runner {
  return async <T>(sql: string, params?: readonly unknown[], options?: QueryOptions) => {
    const values = params as unknown[] | undefined;
    const result = await target.query(
      prepare && options?.prepare
        ? { name: statementName(sql), text: sql, ...(values ? { values } : {}) }
        : { text: sql, ...(values ? { values } : {}) },
    );
    return { rows: detachRows(result) as T[], rowCount: result.rowCount ?? 0 };
  };
}

/**
 * The rows of a result, in an array of their own; pg's is emptied. pg
 * collects every result's rows in an array made at one place (`new Result`)
 * as they arrive, and a result still arriving when V8 collects its young
 * generation survives; once enough have, V8 allocates those arrays straight
 * in the old generation. A dead array there holds its rows as if alive
 * until a full collection: every row the process reads (with its parsed
 * jsonb) is then promoted, 2 MB a scavenge during an export, and RSS grew
 * by 55 MB an export of 100,000 events. Emptied, it holds nothing.
 */
function detachRows(result: pg.QueryResult): unknown[] {
  const rows = result.rows.slice();
  result.rows.length = 0;
  return rows;
}

class PostgresDatabase implements SqlDatabase {
  readonly backend = 'postgres' as const;

  readonly query: Runner;

  constructor(
    private readonly pool: pg.Pool,
    private readonly prepare: boolean,
  ) {
    this.query = runner(pool, prepare);
  }

  async transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T> {
    const client = await this.pool.connect();
    try {
      const result = await inTransaction(client, this.prepare, fn);
      client.release();
      return result;
    } catch (error) {
      // A client whose ROLLBACK failed may be mid-transaction: destroy it.
      client.release(error instanceof RollbackFailedError);
      throw error instanceof RollbackFailedError ? error.original : error;
    }
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}

class RollbackFailedError extends Error {
  constructor(readonly original: unknown) {
    super('ROLLBACK failed');
  }
}

async function inTransaction<T>(
  client: PoolClient,
  prepare: boolean,
  fn: (tx: SqlTransaction) => Promise<T>,
): Promise<T> {
  const tx: SqlTransaction = {
    query: runner(client, prepare),
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
