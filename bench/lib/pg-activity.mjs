// Samples pg_stat_activity of the bench database during a window: how many of
// the services' connections are running a statement, waiting for the client
// in the middle of a transaction, or idle, and what the active ones wait for.
// "idle in transaction" means Postgres waits for the service's next statement.

const SAMPLE_SQL = `
  SELECT state, coalesce(wait_event_type || ':' || wait_event, 'cpu') AS wait, count(*)::int AS n
    FROM pg_stat_activity
   WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
   GROUP BY 1, 2`;

export function startActivitySampler(cluster, intervalMs = 250) {
  const totals = new Map();
  let samples = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      try {
        const { rows } = await cluster.db.query(SAMPLE_SQL);
        samples += 1;
        for (const row of rows) {
          const key = row.state === 'active' ? `active (${row.wait})` : row.state;
          totals.set(key, (totals.get(key) ?? 0) + row.n);
        }
      } catch {
        // the database went away: stop sampling
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      const average = {};
      for (const [key, n] of [...totals].sort((a, b) => b[1] - a[1])) {
        average[key] = samples > 0 ? Math.round((n / samples) * 10) / 10 : 0;
      }
      return { samples, average };
    },
  };
}

export function formatActivity(activity) {
  if (!activity || activity.samples === 0) return 'Postgres connections: not sampled';
  const parts = Object.entries(activity.average).map(([key, n]) => `${key} ${n}`);
  return `Postgres connections of the services (average): ${parts.join(', ')}`;
}
