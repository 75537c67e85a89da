// The services' own Prometheus counters: how many appends a scenario caused
// and how long they took inside the service (pool wait and all), by writer
// (`user`: gateways storing user actions; `agent`: workers storing the
// agent's events and state changes).

const APPEND_LINE = /^cs_event_append_seconds_(sum|count)\{([^}]*)\}\s+(\S+)/;

async function scrape(url) {
  try {
    const response = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5000) });
    return response.ok ? await response.text() : '';
  } catch {
    return '';
  }
}

/** Sums of `cs_event_append_seconds` over every live gateway and worker. */
export async function appendTotals(cluster) {
  const totals = {};
  const texts = await Promise.all(cluster.processes().map((p) => scrape(p.url)));
  for (const text of texts) {
    for (const line of text.split('\n')) {
      const match = APPEND_LINE.exec(line);
      if (!match) continue;
      const writer = /writer="([^"]*)"/.exec(match[2])?.[1] ?? 'unknown';
      totals[writer] ??= { count: 0, sum: 0 };
      totals[writer][match[1]] += Number(match[3]);
    }
  }
  return totals;
}

/**
 * Appends per message and their mean duration in the service, by writer,
 * between two `appendTotals` (processes restarted in between make it wrong).
 */
export function appendsPerMessage(before, after, messages) {
  const result = {};
  for (const writer of Object.keys(after)) {
    const count = after[writer].count - (before[writer]?.count ?? 0);
    const sum = after[writer].sum - (before[writer]?.sum ?? 0);
    if (count <= 0) continue;
    result[writer] = {
      perMessage: messages > 0 ? Math.round((count / messages) * 100) / 100 : null,
      meanMs: Math.round((sum / count) * 1000 * 100) / 100,
    };
  }
  return result;
}

export function formatAppends(appends) {
  const parts = Object.entries(appends).map(
    ([writer, a]) => `${writer} ${a.perMessage} per message, mean ${a.meanMs} ms`,
  );
  return parts.length ? `appends (service side): ${parts.join('; ')}` : 'appends: not measured';
}
