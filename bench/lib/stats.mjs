// Latency statistics: nearest-rank percentiles over raw samples (milliseconds).

/** The value at percentile `p` (0..100) of an ascending array, nearest rank. */
export function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1];
}

/** n, min, mean, p50, p95, p99, max of the samples (null fields when there are none). */
export function summarize(samples) {
  const sorted = Float64Array.from(samples).sort();
  const n = sorted.length;
  let sum = 0;
  for (const value of sorted) sum += value;
  return {
    n,
    min: n ? round(sorted[0]) : null,
    mean: n ? round(sum / n) : null,
    p50: round(percentile(sorted, 50)),
    p95: round(percentile(sorted, 95)),
    p99: round(percentile(sorted, 99)),
    max: n ? round(sorted[n - 1]) : null,
  };
}

/** Rounds to 3 significant decimals below 10, 2 below 100, 1 above (null stays null). */
export function round(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return null;
  const digits = Math.abs(value) < 10 ? 3 : Math.abs(value) < 100 ? 2 : 1;
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}

/** A short "p50 / p95 / p99 ms" line for the console. */
export function formatSummary(summary, unit = 'ms') {
  if (!summary || summary.n === 0) return 'no samples';
  return `p50 ${summary.p50} ${unit}  p95 ${summary.p95} ${unit}  p99 ${summary.p99} ${unit}  max ${summary.max} ${unit}  (n=${summary.n})`;
}
