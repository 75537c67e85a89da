// The statements a store runs, recorded so that a spec can ask Postgres (or
// PGlite) how it plans each of them: the relations a plan touches, and the
// indexes of its generic plan (the one a pooled connection keeps once a
// prepared statement has run five times).
import type { SqlDatabase, SqlTransaction } from '@cs/store';

export interface Recorded {
  sql: string;
  params: readonly unknown[] | undefined;
}

/** The database, recording every statement the store runs (in transactions too). */
export function recordingDatabase(database: SqlDatabase): {
  database: SqlDatabase;
  statements: Recorded[];
} {
  const statements: Recorded[] = [];
  const recorded = Object.create(database) as SqlDatabase;
  recorded.query = (sql, params, options) => {
    statements.push({ sql, params });
    return database.query(sql, params, options);
  };
  recorded.transaction = (fn) =>
    database.transaction((tx) => {
      const recordedTx = Object.create(tx) as SqlTransaction;
      recordedTx.query = (sql, params, options) => {
        statements.push({ sql, params });
        return tx.query(sql, params, options);
      };
      return fn(recordedTx);
    });
  return { database: recorded, statements };
}

/** The relations the plan of `statement` reads or writes, with its parameters bound. */
export async function relationsOf(database: SqlDatabase, statement: Recorded): Promise<string[]> {
  const { rows } = await database.query<{ 'QUERY PLAN': unknown }>(
    `EXPLAIN (FORMAT JSON) ${statement.sql}`,
    statement.params,
  );
  return valuesOf(rows[0]?.['QUERY PLAN'], 'Relation Name');
}

let probes = 0;

/**
 * The indexes the generic plan of `statement` goes through: the plan built
 * without its parameters' values, as a prepared statement's is once it has
 * run a few times, and then kept for the life of the connection.
 */
export async function genericPlanIndexes(
  database: SqlDatabase,
  statement: Recorded,
): Promise<string[]> {
  const params = statement.params ?? [];
  // EXECUTE takes its arguments as literals (a utility statement has no parameters).
  const args = params.map(literal).join(', ');
  return database.transaction(async (tx) => {
    await tx.query(`SET LOCAL plan_cache_mode = force_generic_plan`);
    // Prepared statements outlive the transaction: each probe gets its own name.
    const name = `generic_probe_${(probes += 1)}`;
    await tx.query(`PREPARE ${name} AS ${statement.sql}`);
    const { rows } = await tx.query<{ 'QUERY PLAN': unknown }>(
      `EXPLAIN (FORMAT JSON) EXECUTE ${name}${params.length > 0 ? `(${args})` : ''}`,
    );
    await tx.query(`DEALLOCATE ${name}`);
    return valuesOf(rows[0]?.['QUERY PLAN'], 'Index Name');
  });
}

/** A parameter as an SQL literal of unknown type (the statement's parameter type applies). */
function literal(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
  return `'${text(value).replaceAll("'", "''")}'`;
}

/** A parameter's text, as the driver would send it. */
function text(value: unknown): string {
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) {
    const items = value.map((item: unknown) =>
      item === null || item === undefined
        ? 'NULL'
        : `"${text(item).replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`,
    );
    return `{${items.join(',')}}`;
  }
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(value);
    default:
      return JSON.stringify(value);
  }
}

/** Every value of `key` in a JSON plan. */
function valuesOf(plan: unknown, key: string): string[] {
  const found: string[] = [];
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) {
      node.forEach(walk);
    } else if (typeof node === 'object' && node !== null) {
      for (const [name, value] of Object.entries(node)) {
        if (name === key && typeof value === 'string') found.push(value);
        else walk(value);
      }
    }
  };
  // pg parses the JSON plan; PGlite may hand it over as text.
  walk(typeof plan === 'string' ? JSON.parse(plan) : plan);
  return found;
}
