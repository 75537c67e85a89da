// Reading Prometheus counters from the `/metrics` of running processes.
import { expect } from 'vitest';

/** The sum of a metric's samples over all its label sets in one scrape, or undefined when it has none. */
export function metricSample(text: string, name: string): number | undefined {
  let total: number | undefined;
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)/.exec(line);
    if (match?.[1] === name) total = (total ?? 0) + Number(match[3]);
  }
  return total;
}

/**
 * Each metric of `names`, summed over the processes at `urls` (a cluster's
 * gateways: each counts what it decided). A metric missing from a process fails.
 */
export async function metricTotals<Name extends string>(
  urls: readonly string[],
  names: readonly Name[],
): Promise<Record<Name, number>> {
  const scrapes = await Promise.all(
    urls.map(async (url) => {
      const response = await fetch(`${url}/metrics`);
      expect(response.status).toBe(200);
      return { url, text: await response.text() };
    }),
  );
  const totals = {} as Record<Name, number>;
  for (const name of names) {
    totals[name] = 0;
    for (const { url, text } of scrapes) {
      const value = metricSample(text, name);
      expect(value, `${name} on ${url}`).toBeDefined();
      totals[name] += value ?? 0;
    }
  }
  return totals;
}

/** How much each metric of `names` grew from `before` to `after`. */
export function metricGrowth<Name extends string>(
  before: Record<Name, number>,
  after: Record<Name, number>,
): Record<Name, number> {
  const growth = {} as Record<Name, number>;
  for (const name of Object.keys(after) as Name[]) growth[name] = after[name] - before[name];
  return growth;
}
