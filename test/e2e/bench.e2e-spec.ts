// The benchmark harness (`npm run bench`), without its figures: a small run of
// every scenario against a real cluster must measure and clean up, and the
// "Figures to reach" table must judge what a run measured. Timing itself is
// never asserted here; `npm run bench` reports it.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/processes.js';
import { testDatabaseUrl } from '../support/services.js';

interface Summary {
  p50: number;
  p99: number;
}
interface Level {
  offeredRate?: number;
  throughput: { value: number };
  latency: Summary;
}
interface Results {
  scenarios: {
    'building-blocks': { blocks: Record<string, Summary> };
    'round-trip': { latency: Summary };
    sustained: { levels: Level[] };
  };
}
interface ReportModule {
  latestResults(): string | null;
  renderMarkdown(data: Results, chart: string | null): string;
}

const report = async () =>
  (await import(pathToFileURL(join(ROOT, 'bench/lib/report.mjs')).href)) as ReportModule;

/** The "Met" cell of a row of the figures table. */
function verdict(markdown: string, figure: string): string {
  const row = markdown.split('\n').find((line) => line.startsWith(`| ${figure}`));
  if (!row) throw new Error(`no row "${figure}" in:\n${markdown}`);
  return row.split('|').at(-2)!.trim();
}

async function benchDatabases(): Promise<string[]> {
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

describe('npm run bench', () => {
  it('measures every scenario on a cluster of its own, then removes it', async () => {
    const before = await benchDatabases();
    // Small and short: this checks that each scenario runs and counts, not how fast.
    const child = spawn(
      process.execPath,
      [
        'bench/run.mjs',
        '--quick',
        '--no-write',
        '--duration',
        '2',
        '--lease-ttl-ms',
        '2000',
        '--failover-conversations',
        '10',
        '--replay-events',
        '500',
        '--memory-sockets',
        '40',
        '--memory-conversations',
        '20',
        '--streams',
        '10',
        '--model-conversations',
        '5',
        '--history-events',
        '400',
      ],
      { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));

    expect(code, output).toBe(0);
    expect(output).not.toContain('✗');
    for (const line of [
      /Socket\.IO ack round trip .* p50 [\d.]+ ms .*\(n=\d+\)/,
      /Redis PUBLISH → subscriber .* p50 [\d.]+ ms/,
      /Postgres INSERT \(autocommit, durable\) .* p50 [\d.]+ ms/,
      /BullMQ add → processor start .* p50 [\d.]+ ms/,
      /message → echo +p50 [\d.]+ ms .*\(n=100\)/,
      /connect → awaiting_user_input +p50 [\d.]+ ms .*\(n=10\)/,
      /connect → last of 500 events +p50 [\d.]+ ms/,
      /Failover[^]*10\/10 answered/,
      /Hand-off[^]*10\/10 answered/,
      /100 clients at 500 msg\/s: .*errors 0/,
      /40 idle sockets \(0 failed/,
      /20 idle conversations hosted/,
      /one stream: 1 stream\(s\) × 50 deltas\/s: p50 [\d.]+ ms .*lost 0, errors 0/,
      /concurrent: 10 stream\(s\) × 50 deltas\/s: p50 [\d.]+ ms .*lost 0, errors 0/,
      /Redis PUBLISH → subscriber, one every 20 ms: p50 [\d.]+ ms/,
      /1 conversation: model's first chunk → client's first delta +p50 [\d.]+ ms .*\(n=3\)/,
      /5 conversations: model's last chunk → client's final message p50 [\d.]+ ms .*\(n=10\)/,
      /SDK \(libs\/client\/dist with socket\.io-client\): \d+ bytes minified, \d+ bytes gzipped/,
      /web app initial JavaScript .*: \d+ bytes gzipped/,
      /open a conversation of 400 events → its latest on screen +p50 [\d.]+ ms .*\(n=2\)/,
      /streamed delta reached the page → painted +p50 [\d.]+ ms/,
      /worst hostile message: \d+ chars of .+, reached the page → painted [\d.]+ ms/,
      /connect → awaiting_user_input \(400 events stored\) +p50 [\d.]+ ms .*\(n=5\)/,
      /5 conversations of 400 events hosted/,
    ]) {
      expect(output).toMatch(line);
    }
    expect(output).not.toMatch(/errors [1-9]/);
    expect(await benchDatabases()).toEqual(before);
  }, 300_000);

  it('judges each figure from what the run measured', async () => {
    const { latestResults, renderMarkdown } = await report();
    const file = latestResults();
    expect(file).not.toBeNull();
    const measured = JSON.parse(readFileSync(file!, 'utf8')) as Results;
    const variant = (change: (data: Results) => void) => {
      const data = structuredClone(measured);
      change(data);
      return renderMarkdown(data, null);
    };
    const blocks = measured.scenarios['building-blocks'].blocks;
    const budget = ['socketio_ack', 'pg_insert', 'pg_insert', 'redis_hop', 'redis_hop']
      .map((name) => blocks[name]!.p50)
      .reduce((a, b) => a + b, 0);
    const level = (offeredRate: number, throughput: number, p99: number): Level => ({
      offeredRate,
      throughput: { value: throughput },
      latency: { p50: 1, p99 },
    });

    const roundTrip = (p50: number) =>
      verdict(
        variant((d) => (d.scenarios['round-trip'].latency.p50 = p50)),
        'round trip p50',
      );
    expect(roundTrip(budget * 2.9)).toBe('yes');
    expect(roundTrip(budget * 3.1)).toBe('**no**');

    const sustained = (levels: Level[]) =>
      verdict(
        variant((d) => (d.scenarios.sustained.levels = levels)),
        'sustained load',
      );
    // A level meets it with ≥ 1,000 answered per second and p99 ≤ 100 ms.
    expect(sustained([level(1000, 999.7, 30), level(1100, 1100.2, 65)])).toBe('yes');
    expect(sustained([level(1000, 999.7, 30), level(1250, 1250, 216)])).toBe('**no**');
  });
});
