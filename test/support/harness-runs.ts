// Runs the chaos and benchmark harnesses (chaos/run.mjs, bench/run.mjs) as a
// reader would with `npm run chaos` / `npm run bench`, for the smoke runs of
// `npm test` and the long runs of `npm run test:soak`.
import { spawn } from 'node:child_process';
import pg from 'pg';
import { expect } from 'vitest';
import { ROOT } from './processes.js';
import { testDatabaseUrl } from './services.js';

export interface HarnessRun {
  code: number | null;
  /** stdout and stderr, interleaved as they came. */
  output: string;
}

/** Runs `node <script> <args>` from the repository's root, to its exit. */
export async function runHarness(script: string, args: string[]): Promise<HarnessRun> {
  const child = spawn(process.execPath, [script, ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  return { code, output };
}

/**
 * A chaos run of `durationS` seconds (faults drawn from `seed`) finds no
 * violation, and did something: more than `ackedMoreThan` messages
 * acknowledged and a fault injected. `redisCluster`: on a local Redis
 * Cluster (`--redis-cluster`), with at least one Redis fault among them.
 */
export async function expectChaosPasses(options: {
  durationS: number;
  seed: number;
  ackedMoreThan: number;
  redisCluster?: boolean;
}): Promise<void> {
  const { code, output } = await runHarness('chaos/run.mjs', [
    '--duration',
    String(options.durationS),
    '--seed',
    String(options.seed),
    ...(options.redisCluster ? ['--redis-cluster'] : []),
  ]);
  const summary = output.trim().split('\n').at(-1) ?? '';
  expect(summary, output).toMatch(/^chaos: PASS seed=\d+ .* violations=0$/);
  expect(code, output).toBe(0);
  expect(Number(/acked=(\d+)/.exec(summary)?.[1]), output).toBeGreaterThan(options.ackedMoreThan);
  expect(Number(/faults=(\d+)/.exec(summary)?.[1]), output).toBeGreaterThan(0);
  if (options.redisCluster) {
    expect(summary, output).toContain(' redis=cluster ');
    expect(Number(/redis_faults=(\d+)/.exec(summary)?.[1]), output).toBeGreaterThan(0);
  }
}

/** The databases of bench runs (bench_…) on the test Postgres: a run leaves none behind. */
export async function benchDatabases(): Promise<string[]> {
  const client = new pg.Client({ connectionString: testDatabaseUrl() });
  await client.connect();
  try {
    const { rows } = await client.query<{ datname: string }>(
      "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'",
    );
    return rows.map((row) => row.datname);
  } finally {
    await client.end();
  }
}
