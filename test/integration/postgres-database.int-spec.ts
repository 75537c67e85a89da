// `openPostgres` on a real Postgres: the rows it hands out are not held by
// pg's own result any more (see `detachRows`: V8 may allocate pg's row arrays
// in the old generation, where a dead one keeps every row alive until a full
// collection). pg's results are watched through its own `Result` class.
import pg from 'pg';
import type { SqlDatabase } from '@cs/store';
import { openPostgres } from '@cs/store';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createScratchDatabase, type ScratchDatabase } from '../support/services.js';

/** pg's result class (not in its type definitions): it collects a statement's rows. */
interface PgResult {
  rows: unknown[];
}
const { Result } = pg as unknown as {
  Result: { prototype: { addCommandComplete(this: PgResult, message: unknown): void } };
};

describe('PostgresDatabase', () => {
  let scratch: ScratchDatabase;
  let database: SqlDatabase;
  let seen: PgResult[];
  const addCommandComplete = Result.prototype.addCommandComplete;

  beforeAll(async () => {
    scratch = await createScratchDatabase('cs_pg_rows');
    database = openPostgres(scratch.url, { poolSize: 2 });
  });

  afterAll(async () => {
    await database?.close();
    await scratch?.drop();
  });

  beforeEach(() => {
    seen = [];
    Result.prototype.addCommandComplete = function (this: PgResult, message: unknown) {
      seen.push(this);
      addCommandComplete.call(this, message);
    };
  });

  afterEach(() => {
    Result.prototype.addCommandComplete = addCommandComplete;
  });

  it("hands out the rows in an array of its own and leaves pg's result empty", async () => {
    const sql =
      'SELECT g AS n, jsonb_build_object($1::text, g) AS doc FROM generate_series(1, 3) g';
    const plain = await database.query<{ n: number; doc: unknown }>(sql, ['k']);
    const prepared = await database.query<{ n: number }>(sql, ['k'], { prepare: true });
    const inTransaction = await database.transaction((tx) =>
      tx.query<{ n: number }>('SELECT 7 AS n'),
    );

    expect(plain.rows).toEqual([1, 2, 3].map((n) => ({ n, doc: { k: n } })));
    expect(plain.rowCount).toBe(3);
    expect(prepared.rows.map((row) => row.n)).toEqual([1, 2, 3]);
    expect(inTransaction.rows).toEqual([{ n: 7 }]);
    // The three statements' results (and BEGIN's, COMMIT's), each emptied.
    expect(seen.length).toBeGreaterThanOrEqual(3);
    expect(seen.map((result) => result.rows.length)).toEqual(seen.map(() => 0));
  });
});
