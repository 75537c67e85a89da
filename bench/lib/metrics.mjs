// The services' own Prometheus metrics: how many appends a window caused and
// how long they took inside the service (pool wait and all), by writer
// (`user`: gateways storing user actions; `agent`: workers storing the
// agent's events and state changes), and each process's event-loop delay.
// prom-client resets its event-loop histogram at every scrape, so a scrape at
// the end of a window describes the window since the previous scrape.

const APPEND_LINE = /^cs_event_append_seconds_(sum|count)\{([^}]*)\}\s+(\S+)/;
const LAG_LINE = /^cs_nodejs_eventloop_lag_(mean|p99|max)_seconds(?:\{[^}]*\})?\s+(\S+)/;

async function scrape(url) {
  try {
    const response = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(5000) });
    return response.ok ? await response.text() : '';
  } catch {
    return '';
  }
}

/**
 * One scrape of every live gateway and worker: append totals summed by
 * writer, and event-loop delay (ms) per process since its previous scrape.
 */
export async function serviceSnapshot(cluster) {
  const processes = cluster.processes();
  const texts = await Promise.all(processes.map((p) => scrape(p.url)));
  const appends = {};
  const eventLoop = {};
  texts.forEach((text, index) => {
    const lag = {};
    for (const line of text.split('\n')) {
      const append = APPEND_LINE.exec(line);
      if (append) {
        const writer = /writer="([^"]*)"/.exec(append[2])?.[1] ?? 'unknown';
        appends[writer] ??= { count: 0, sum: 0 };
        appends[writer][append[1]] += Number(append[3]);
        continue;
      }
      const delay = LAG_LINE.exec(line);
      if (delay) lag[`${delay[1]}Ms`] = Math.round(Number(delay[2]) * 1000 * 10) / 10;
    }
    if (Object.keys(lag).length > 0) eventLoop[processes[index].name] = lag;
  });
  return { appends, eventLoop };
}

/** Appends per message and their mean duration in the service, by writer, between two snapshots. */
export function appendsPerMessage(before, after, messages) {
  const result = {};
  for (const writer of Object.keys(after.appends)) {
    const count = after.appends[writer].count - (before.appends[writer]?.count ?? 0);
    const sum = after.appends[writer].sum - (before.appends[writer]?.sum ?? 0);
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
    ([writer, a]) => `${writer} ${a.perMessage} per answer, mean ${a.meanMs} ms`,
  );
  return parts.length ? `appends (service side): ${parts.join('; ')}` : 'appends: not measured';
}

export function formatEventLoop(eventLoop) {
  const parts = Object.entries(eventLoop).map(
    ([name, lag]) => `${name} ${lag.meanMs}/${lag.p99Ms}/${lag.maxMs}`,
  );
  return parts.length
    ? `event-loop delay mean/p99/max ms: ${parts.join(', ')}`
    : 'event-loop delay: not measured';
}
