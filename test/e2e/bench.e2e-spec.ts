// The benchmark harness (`npm run bench`), without its figures, as the bench
// smoke of `npm test`: a quick run of two scenarios (the building blocks and
// the round trip) against a real cluster must measure and clean up, so must a
// tiny run of the Redis Cluster's scenario (beside one Redis), and the
// "Figures to reach" table must judge what a run measured. Timing itself is
// never asserted here; `npm run bench` reports it. Every scenario runs in
// `npm run test:soak` (test/soak/bench.soak-spec.ts).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { benchDatabases, runHarness } from '../support/harness-runs.js';
import { ROOT } from '../support/processes.js';

interface Summary {
  p50: number;
  p99: number;
}
interface Level {
  offeredRate?: number;
  throughput: { value: number };
  latency: Summary;
}
interface RedisClusterResult {
  /** Which cluster ran it (every scenario's result says so). */
  cluster?: unknown;
  roundTrip: { latency: Summary };
  roundTripRatio: number | null;
  sustained: { levels: Level[] };
  failover: null;
  masterKill: {
    acknowledged: number;
    unanswered: number;
    affected: number;
    withinBound: number;
    boundMs: number;
    firstAnswerAffected: { max: number };
  };
}
interface Results {
  scenarios: {
    'building-blocks': { blocks: Record<string, Summary> };
    'round-trip': { latency: Summary; cluster?: unknown };
    sustained: { levels: Level[] };
    'redis-cluster'?: RedisClusterResult;
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

describe('npm run bench', () => {
  it('measures the building blocks and the round trip on a cluster of its own, then removes it', async () => {
    const before = await benchDatabases();
    const { code, output } = await runHarness('bench/run.mjs', [
      '--quick',
      '--no-write',
      '--only',
      'building-blocks,round-trip',
      '--lease-ttl-ms',
      '2000',
    ]);

    expect(code, output).toBe(0);
    expect(output).not.toContain('✗');
    for (const line of [
      /Socket\.IO ack round trip .* p50 [\d.]+ ms .*\(n=\d+\)/,
      /Redis PUBLISH → subscriber .* p50 [\d.]+ ms/,
      /Postgres INSERT \(autocommit, durable\) .* p50 [\d.]+ ms/,
      /BullMQ add → processor start .* p50 [\d.]+ ms/,
      /message → echo +p50 [\d.]+ ms .*\(n=100\)/,
    ]) {
      expect(output).toMatch(line);
    }
    expect(output).not.toMatch(/errors [1-9]/);
    expect(await benchDatabases()).toEqual(before);
  }, 180_000);

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

    // The Redis Cluster's rows: its round trip against one Redis's of the same run, its
    // sustained load, and kill -9 of a master (every acknowledged message answered, the
    // first answer of its conversations within cluster-node-timeout + 3 s).
    const single = measured.scenarios['round-trip'].latency.p50;
    const onCluster = (change: (rc: RedisClusterResult) => void) =>
      variant((d) => {
        const rc: RedisClusterResult = {
          cluster: d.scenarios['round-trip'].cluster,
          roundTrip: { latency: { p50: single * 1.2, p99: 1 } },
          roundTripRatio: 1.2,
          sustained: { levels: [level(1000, 1000.1, 80)] },
          failover: null,
          masterKill: {
            acknowledged: 400,
            unanswered: 0,
            affected: 5,
            withinBound: 5,
            boundMs: 5000,
            firstAnswerAffected: { max: 4100 },
          },
        };
        change(rc);
        d.scenarios['redis-cluster'] = rc;
      });
    const cluster = 'on a 3-master Redis Cluster with 8 queues:';
    expect(
      verdict(
        onCluster(() => undefined),
        `${cluster} round trip p50`,
      ),
    ).toBe('yes');
    expect(
      verdict(
        onCluster((rc) => (rc.roundTripRatio = 1.4)),
        `${cluster} round trip p50`,
      ),
    ).toBe('**no**');
    expect(
      verdict(
        onCluster(() => undefined),
        `${cluster} sustained load`,
      ),
    ).toBe('yes');
    expect(
      verdict(
        onCluster((rc) => (rc.sustained.levels = [level(1000, 640, 900)])),
        `${cluster} sustained load`,
      ),
    ).toBe('**no**');
    const kill = `${cluster} kill -9 of a Redis master under load`;
    expect(
      verdict(
        onCluster(() => undefined),
        kill,
      ),
    ).toBe('yes');
    expect(
      verdict(
        onCluster((rc) => (rc.masterKill.unanswered = 1)),
        kill,
      ),
    ).toBe('**no**');
    expect(
      verdict(
        onCluster((rc) => (rc.masterKill.withinBound = 4)),
        kill,
      ),
    ).toBe('**no**');
    // Without the scenario in the results, no such row.
    expect(variant((d) => delete d.scenarios['redis-cluster'])).not.toContain(cluster);
  });
});
