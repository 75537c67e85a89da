// The statements a store runs, recorded so that a spec can ask Postgres (or
// PGlite) how it plans each of them: the relations a plan touches, and the
// nodes of its generic plan (the one a pooled connection keeps once a
// prepared statement has run five times).
import type { SqlDatabase, SqlTransaction } from '@cs/store';

export interface Recorded {
  sql: string;
  params: readonly unknown[] | undefined;
  /** Sent as a named prepared statement (`PREPARED`): planned generically after a few runs. */
  prepared: boolean;
}

/** The database, recording every statement the store runs (in transactions too). */
export function recordingDatabase(database: SqlDatabase): {
  database: SqlDatabase;
  statements: Recorded[];
} {
  const statements: Recorded[] = [];
  const recorded = Object.create(database) as SqlDatabase;
  recorded.query = (sql, params, options) => {
    statements.push({ sql, params, prepared: options?.prepare === true });
    return database.query(sql, params, options);
  };
  recorded.transaction = (fn) =>
    database.transaction((tx) => {
      const recordedTx = Object.create(tx) as SqlTransaction;
      recordedTx.query = (sql, params, options) => {
        statements.push({ sql, params, prepared: options?.prepare === true });
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
  return nodesOf(rows[0]?.['QUERY PLAN']).flatMap((node) => node['Relation Name'] ?? []);
}

let probes = 0;

/** A node of a JSON plan: what it does, and to which relation through which index. */
export interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
}

/**
 * The nodes of the generic plan of `statement`: the plan built without its
 * parameters' values, as a prepared statement's is once it has run a few
 * times, and then kept for the life of the connection.
 */
export async function genericPlanNodes(
  database: SqlDatabase,
  statement: Recorded,
): Promise<PlanNode[]> {
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
    return nodesOf(rows[0]?.['QUERY PLAN']);
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

/** Every node of a JSON plan (pg parses it; PGlite may hand it over as text). */
function nodesOf(plan: unknown): PlanNode[] {
  const found: PlanNode[] = [];
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) {
      node.forEach(walk);
    } else if (typeof node === 'object' && node !== null) {
      if ('Node Type' in node) found.push(node as PlanNode);
      Object.values(node).forEach(walk);
    }
  };
  walk(typeof plan === 'string' ? JSON.parse(plan) : plan);
  return found;
}
