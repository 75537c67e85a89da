/**
 * `SqlDatabase` on PGlite (Postgres in WebAssembly, in this process). PGlite is
 * one database session: concurrent BEGIN … COMMIT from several callers would
 * interleave and commit each other's half-done work, so every transaction goes
 * through `db.transaction`, which serialises them, and uses only its `tx`.
 */
import { PGlite } from '@electric-sql/pglite';
import type { Results, Transaction } from '@electric-sql/pglite';
import type { QueryOptions, SqlDatabase, SqlResult, SqlTransaction } from './sql-database.js';
import { makePrivateDir } from './data-dir.lock.js';
import { INT8_OID, parseInt8 } from './sql-database.js';

export interface PgliteOptions {
  /** Called once the database is closed (the embedded database releases its folder lock). */
  onClose?: () => Promise<void>;
  /**
   * A data folder to start from instead of a new one, as the tarball of
   * PGlite's `dumpDataDir()`: the tests' migrated template, which spares
   * each in-memory database the seconds of initdb.
   */
  loadDataDir?: Blob;
}

/**
 * Opens PGlite in `dataDir`, or in memory when it is undefined. Nothing stops
 * two processes from opening the same folder: use `openEmbeddedDatabase`,
 * which locks it, for anything but tests. The folder is made private (0700):
 * PGlite writes its files readable and writable by anyone (0666).
 */
export async function openPglite(
  dataDir: string | undefined,
  options: PgliteOptions = {},
): Promise<SqlDatabase> {
  // A plain path is a folder of the file system; `memory://` and the like are not.
  if (dataDir !== undefined && !/^[a-z]+:\/\//i.test(dataDir)) makePrivateDir(dataDir);
  const db = await PGlite.create({
    ...(dataDir === undefined ? {} : { dataDir }),
    ...(options.loadDataDir === undefined ? {} : { loadDataDir: options.loadDataDir }),
    parsers: { [INT8_OID]: parseInt8 },
  });
  return new PgliteDatabase(db, options.onClose);
}

function toResult<T>(result: Results<T>): SqlResult<T> {
  return { rows: result.rows, rowCount: Math.max(result.affectedRows ?? 0, result.rows.length) };
}

class PgliteDatabase implements SqlDatabase {
  readonly backend = 'pglite' as const;
  private closing: Promise<void> | undefined;

  constructor(
    private readonly db: PGlite,
    private readonly onClose: (() => Promise<void>) | undefined,
  ) {}

  async query<T>(
    sql: string,
    params?: readonly unknown[],
    _options?: QueryOptions,
  ): Promise<SqlResult<T>> {
    return toResult(await this.db.query<T>(sql, params as unknown[] | undefined));
  }

  transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T> {
    return this.db.transaction((tx) => fn(wrapTransaction(tx)));
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      try {
        await this.db.close();
      } finally {
        await this.onClose?.();
      }
    })();
    return this.closing;
  }
}

function wrapTransaction(tx: Transaction): SqlTransaction {
  return {
    async query<R>(sql: string, params?: readonly unknown[]) {
      return toResult(await tx.query<R>(sql, params as unknown[] | undefined));
    },
    async exec(script: string) {
      await tx.exec(script);
    },
  };
}
