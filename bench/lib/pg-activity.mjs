// Samples pg_stat_activity of the bench database during a window: how many of
// each role's connections (gateways, workers: matched through the client's
// TCP port and /proc) are running a statement, waiting for the service in the
// middle of a transaction ("idle in transaction": Postgres waits for the
// service's next statement), or idle, and what the active ones wait for.
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';

const SAMPLE_SQL = `
  SELECT client_port, state, coalesce(wait_event_type || ':' || wait_event, 'cpu') AS wait
    FROM pg_stat_activity
   WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`;

/** Local TCP port → name of the process owning the socket, for the given processes. */
function portOwners(processes) {
  const inodeOwner = new Map();
  for (const p of processes) {
    let fds;
    try {
      fds = readdirSync(`/proc/${p.pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      try {
        const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${p.pid}/fd/${fd}`));
        if (match) inodeOwner.set(match[1], p.name);
      } catch {
        // closed meanwhile
      }
    }
  }
  const owners = new Map();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let lines;
    try {
      lines = readFileSync(file, 'utf8').split('\n').slice(1);
    } catch {
      continue;
    }
    for (const line of lines) {
      const columns = line.trim().split(/\s+/);
      if (columns.length < 10) continue;
      const owner = inodeOwner.get(columns[9]);
      if (owner) owners.set(parseInt(columns[1].split(':')[1], 16), owner);
    }
  }
  return owners;
}

const roleOf = (name) => (name ? name.replace(/-\d+$/, 's') : 'other');

export function startActivitySampler(cluster, intervalMs = 250) {
  const totals = new Map(); // role → state → count
  let samples = 0;
  let stopped = false;
  let owners = new Map();
  const loop = (async () => {
    while (!stopped) {
      try {
        const { rows } = await cluster.db.query(SAMPLE_SQL);
        if (rows.some((row) => row.client_port !== null && !owners.has(row.client_port))) {
          owners = portOwners(cluster.processes());
        }
        samples += 1;
        for (const row of rows) {
          const role = roleOf(owners.get(row.client_port));
          const state = row.state === 'active' ? `active (${row.wait})` : row.state;
          const byState = totals.get(role) ?? new Map();
          byState.set(state, (byState.get(state) ?? 0) + 1);
          totals.set(role, byState);
        }
      } catch {
        return; // the database went away: stop sampling
      }
      await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      const byRole = {};
      for (const [role, byState] of totals) {
        byRole[role] = {};
        for (const [state, n] of [...byState].sort((a, b) => b[1] - a[1])) {
          byRole[role][state] = samples > 0 ? Math.round((n / samples) * 10) / 10 : 0;
        }
      }
      return { samples, byRole };
    },
  };
}

/** `{ active, idleInTransaction, idle }` averages of one role. */
export function activitySummary(activity, role) {
  const states = activity?.byRole?.[role];
  if (!states) return null;
  let active = 0;
  for (const [state, n] of Object.entries(states)) if (state.startsWith('active')) active += n;
  return {
    active: Math.round(active * 10) / 10,
    idleInTransaction: states['idle in transaction'] ?? 0,
    idle: states.idle ?? 0,
  };
}

export function formatActivity(activity) {
  if (!activity || activity.samples === 0) return 'Postgres connections: not sampled';
  const parts = Object.entries(activity.byRole).map(
    ([role, states]) =>
      `${role}: ${Object.entries(states)
        .map(([state, n]) => `${state} ${n}`)
        .join(', ')}`,
  );
  return `Postgres connections on average — ${parts.join('; ')}`;
}
