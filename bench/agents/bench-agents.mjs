// Agents of the benchmark, loaded by every gateway and worker of the bench's
// cluster through AGENT_MODULES (docs/protocol.md "Agent modules"), as a product
// team's module would be.
//
// `bench_pacer` streams deltas at a given pace; each delta's text is the time
// it was emitted: `process.hrtime.bigint()` in microseconds, base 36, then a
// space (8 characters, about a model token's length). That clock is the
// machine's CLOCK_MONOTONIC, the same in every process of the machine, so the
// client that receives a delta (in another process) subtracts the emit time
// from its own reading of the same clock.
// The runtime may batch deltas that come close together: one delta a client
// receives may then hold several emit times, each of which is one sample.

import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * The memory probe: with BENCH_MEMORY_PROBE=1, a process that loaded this
 * module answers SIGUSR2 by collecting garbage (a full, forced GC) and then
 * printing its memory as one line on standard error,
 * `BENCH_MEMORY {"rss":…,"heapUsed":…,…}` (bytes), which the bench reads from
 * the process's output. What a process holds is then told apart from garbage
 * it has not collected yet.
 */
if (process.env.BENCH_MEMORY_PROBE === '1') {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc');
  process.on('SIGUSR2', () => {
    gc();
    gc();
    const { rss, heapTotal, heapUsed, external, arrayBuffers } = process.memoryUsage();
    process.stderr.write(
      `BENCH_MEMORY ${JSON.stringify({ rss, heapTotal, heapUsed, external, arrayBuffers })}\n`,
    );
  });
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/** The pace of a turn: the user message may hold `{ "rate": n, "count": n }`, else the agent_config's. */
function paceOf(config, trigger) {
  let asked = {};
  try {
    const parsed = JSON.parse(trigger?.args?.content ?? '');
    if (parsed && typeof parsed === 'object') asked = parsed;
  } catch {
    // a plain message: the configured pace
  }
  const rate = Number(asked.rate ?? config.rate ?? 50);
  const count = Number(asked.count ?? config.count ?? 100);
  return {
    rate: Number.isFinite(rate) && rate > 0 ? rate : 50,
    count: Number.isInteger(count) && count > 0 ? count : 100,
  };
}

export const agents = {
  /**
   * Each turn streams `count` deltas at `rate` deltas per second (on a fixed
   * schedule from the turn's start: a late timer is caught up at once, not
   * skipped), then answers `<count> deltas`.
   */
  bench_pacer: (config) => ({
    async *step(context) {
      const { rate, count } = paceOf(config, context.trigger);
      const { signal } = context;
      const started = performance.now();
      let emitted = 0;
      while (emitted < count) {
        if (signal.aborted) return;
        const due = Math.min(count, Math.floor(((performance.now() - started) * rate) / 1000) + 1);
        while (emitted < due) {
          yield { type: 'delta', delta: `${(process.hrtime.bigint() / 1000n).toString(36)} ` };
          emitted += 1;
        }
        if (emitted >= count) break;
        await sleep(Math.max(0, started + (emitted * 1000) / rate - performance.now()), signal);
      }
      if (signal.aborted) return;
      yield { type: 'message', content: `${count} deltas` };
    },
  }),
};
