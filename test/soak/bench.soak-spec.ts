// The benchmark harness (`npm run bench`) in `npm run test:soak`: a small run
// of every scenario against a real cluster must measure and clean up. Timing
// itself is never asserted here; `npm run bench` reports it. `npm test` runs a
// smoke of it (test/e2e/bench.e2e-spec.ts).
import { describe, expect, it } from 'vitest';
import { benchDatabases, runHarness } from '../support/harness-runs.js';

describe('npm run bench', () => {
  it('measures every scenario on a cluster of its own, then removes it', async () => {
    const before = await benchDatabases();
    // Small and short: this checks that each scenario runs and counts, not how fast.
    const { code, output } = await runHarness('bench/run.mjs', [
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
      '--capacity-rates',
      '30,60,90',
      '--capacity-conversations',
      '30',
      '--webhook-conversations',
      '20',
    ]);

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
      /stop → interrupted answer +p50 [\d.]+ ms .*\(n=5\)/,
      /interrupt → interrupted answer +p50 [\d.]+ ms .*\(n=5\)/,
      /Failover[^]*10\/10 answered/,
      /round trip p50: [\d.]+ ms on the cluster vs [\d.]+ ms on one Redis/,
      /\d+ messages acknowledged, 0 unanswered; \d+ refused \(not stored\)/,
      /30 msg\/s offered over \d+ conversations: .*CPU ms per message: gateway [\d.]+, worker [\d.]+, postgres [\d.]+, redis [\d.]+; Redis commands per message [\d.]+/,
      /10 streams × 50 deltas\/s: [\d.]+ deltas\/s received; CPU ms per delta: gateway [\d.]+/,
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
      /100 turns\/s offered over 20 conversations: .* lag p50 [\d.]+ ms .*errors 0/,
    ]) {
      expect(output).toMatch(line);
    }
    expect(output).not.toMatch(/errors [1-9]/);
    expect(await benchDatabases()).toEqual(before);
  }, 300_000);
});
