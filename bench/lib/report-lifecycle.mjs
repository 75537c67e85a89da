// The data lifecycle's figures in BENCHMARKS.md (bench/scenarios/data-lifecycle.mjs):
// the export of a user and the retention sweep under the sustained load, as
// rows of the targets table and of the results table.
import { round } from './stats.mjs';

const ms = (value) => (value === null || value === undefined ? '–' : `${value} ms`);
const count = (value) => value.toLocaleString('en-US');

/** Rows of "Figures to reach": `{ figure, target, measured, met }`. */
export function lifecycleTargets(s) {
  const rows = [];
  const exported = s['user-export'];
  if (exported?.worst) {
    const { conversations, eventsPerConversation: per, runs, worst } = exported;
    rows.push({
      figure: `export of a user with ${conversations} conversations × ${count(per)} events (worst of ${runs.length})`,
      target: '≥ 50,000 events/s, RSS growth ≤ 50 MB',
      measured:
        `${count(worst.eventsPerSecond)} events/s, RSS +${worst.rssGrowthMiB} MiB` +
        ` (each: ${runs.map((r) => `${count(r.eventsPerSecond)}/s +${r.rssGrowthMiB} MiB`).join('; ')})`,
      met: worst.eventsPerSecond >= 50_000 && worst.rssGrowthMiB * 1.048576 <= 50,
    });
  }
  const retention = s.retention;
  if (retention?.baseline) {
    const { baseline, during } = retention;
    rows.push({
      figure:
        `retention sweep of ${count(retention.conversations)} idle conversations × ${retention.events} events` +
        ` under the sustained load at ${retention.offeredRate} msg/s, p99`,
      target: '≤ 2 × the p99 without the sweep, every conversation deleted',
      measured:
        `${ms(during.latency.p99)} = ×${retention.p99Ratio} of ${ms(baseline.latency.p99)};` +
        ` ${count(retention.deleted)} of ${count(retention.conversations)} deleted in ${retention.sweepS} s` +
        ` (${retention.conversationsPerSecond} conversations/s)`,
      met: retention.p99Ratio !== null && retention.p99Ratio <= 2 && retention.left === 0,
    });
  }
  return rows;
}

/** Rows of "Results": the cells of each (scenario, measure, p50, p95, p99, throughput, versus, notes). */
export function lifecycleResults(s) {
  const rows = [];
  const exported = s['user-export'];
  for (const [index, run] of (exported?.runs ?? []).entries()) {
    rows.push([
      'Data lifecycle',
      `export of a user (${exported.conversations} conversations × ${count(exported.eventsPerConversation)} events), export ${index + 1}`,
      '–',
      '–',
      '–',
      `${count(run.eventsPerSecond)} events/s`,
      '–',
      `${count(run.events)} events in ${run.seconds} s; gateway RSS ${run.rssBeforeMiB} MiB, grew at most ${run.rssGrowthMiB} MiB`,
    ]);
  }
  const retention = s.retention;
  if (retention?.baseline) {
    for (const [name, load] of [
      ['without a sweep', retention.baseline],
      [
        `while the sweep deletes ${count(retention.conversations)} idle conversations`,
        retention.during,
      ],
    ]) {
      rows.push([
        'Data lifecycle',
        `sustained load, ${retention.loadConversations} conversations at ${retention.offeredRate} msg/s, ${name} (${load.windowS} s)`,
        ms(load.latency.p50),
        ms(load.latency.p95),
        ms(load.latency.p99),
        `${load.throughput.value} msg/s`,
        '–',
        `errors ${load.errors}; machine CPU ${round(load.cpu?.machine) ?? '?'}%`,
      ]);
    }
    rows.push([
      'Data lifecycle',
      `retention sweep of ${count(retention.conversations)} conversations × ${retention.events} events (copied in SQL in ${retention.seedS} s)`,
      '–',
      '–',
      '–',
      `${retention.conversationsPerSecond} conversations/s`,
      '–',
      `${count(retention.deleted)} deleted, ${count(retention.left)} left after ${retention.sweepS} s (from making them idle)`,
    ]);
  }
  return rows;
}
