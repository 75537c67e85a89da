/**
 * The little the store needs from a database, implemented on a `pg.Pool` and
 * on PGlite so that the repositories run the same SQL on both. Bigint columns
 * come back as numbers and jsonb as parsed values on both backends.
 */

export interface SqlResult<T> {
  rows: T[];
  /** Rows inserted, updated, deleted or returned by the statement. */
  rowCount: number;
}

export interface QueryOptions {
  /**
   * Keep the statement prepared on the connection (pg): the hot path skips
   * parsing and planning. Only for statements whose generic plan is as good
   * as a custom one (lookups by key); PGlite ignores it.
   */
  prepare?: boolean;
}

/** Prepares a statement on pg; the lookups by key of the hot path use it. */
export const PREPARED: QueryOptions = { prepare: true };

/** Runs one parameterised statement. */
export interface SqlQueryable {
  query<T>(sql: string, params?: readonly unknown[], options?: QueryOptions): Promise<SqlResult<T>>;
}

/** A transaction in progress; `exec` runs a script of several statements without parameters. */
export interface SqlTransaction extends SqlQueryable {
  exec(script: string): Promise<void>;
}

/** Runs statements and transactions. */
export interface SqlSession extends SqlQueryable {
  transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T>;
}

export type SqlBackend = 'postgres' | 'pglite';

export interface SqlDatabase extends SqlSession {
  readonly backend: SqlBackend;
  close(): Promise<void>;
}

/** The Postgres error code of a failed statement, when it has one. */
export function sqlErrorCode(error: unknown): string | undefined {
  if (typeof error === 'object' && error !== null && 'code' in error) {
    const code = error.code;
    return typeof code === 'string' ? code : undefined;
  }
  return undefined;
}

export const UNIQUE_VIOLATION = '23505';

/** int8 as a JS number: ids, epochs and counters stay far below 2^53. */
export function parseInt8(value: string): number {
  const parsed = Number(value);
  if (!Number.isSafeInteger(parsed)) throw new RangeError(`bigint ${value} exceeds 2^53`);
  return parsed;
}

export const INT8_OID = 20;
