// The data lifecycle (docs/protocol.md "Data lifecycle").
// - user-export: a user with 100 conversations of 1,000 events each (written
//   straight into the run's database, bench/lib/history.mjs), exported by
//   `GET /api/users/:id/export` from one gateway three times in a row: events
//   per second through the whole NDJSON stream, read as it arrives, and the
//   growth of that gateway's RSS over each export (sampled every 50 ms). The
//   targets: at least 50,000 events/s and at most 50 MB, whatever the user
//   holds; the worst of the three exports is the figure.
// - retention: 10,000 conversations of 100 events (one stored through the
//   service, then copied in SQL), and the sustained load at 500 msg/s over
//   1,000 other conversations (sustained.mjs), measured once without a sweep,
//   then again while the sweep deletes all 10,000 (their activity set 2 days
//   back: the cluster runs with RETENTION_DAYS=1 and a 2 s sweep interval),
//   until none is left. The target: the load's p99 during the sweep at most
//   2 × its p99 without it.
import { HISTORY_BATCH, cloneHistory, openHistoryStore, seedHistory } from '../lib/history.mjs';
import { api, createConversation, mapLimit } from '../lib/client.mjs';
import { formatCpu, processRssKiB } from '../lib/proc.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { closeConversations, drive, openConversations } from './sustained.mjs';

const TENANT = 'bench';
const USER = 'user-export';

/** Reads an NDJSON body as it arrives; resolves with its line count. */
async function countLines(body) {
  let lines = 0;
  for await (const chunk of body) {
    for (const byte of chunk) if (byte === 10) lines += 1;
  }
  return lines;
}

export async function runUserExport(ctx) {
  const { cluster, options, log } = ctx;
  const conversations = options.quick ? 10 : 100;
  const events = options.quick ? 200 : 1000;
  const gateway = cluster.gateways[0];
  const token = await ctx.token(USER);
  const opened = await openHistoryStore(cluster);
  try {
    const seedStarted = performance.now();
    await mapLimit(
      Array.from({ length: conversations }, (_, i) => i),
      4,
      async (i) => {
        const id = await createConversation(gateway.url, token, { title: `export ${i}` });
        const info = await api(gateway.url, token, 'GET', `/api/conversations/${id}`);
        await seedHistory(opened.store, TENANT, id, info.last_event_id, events);
      },
    );
    log(
      `  seeded ${conversations} conversations × ${events} events in ${round((performance.now() - seedStarted) / 1000)} s (${HISTORY_BATCH} a batch)`,
    );
    // Three in a row: V8's collector may decide how to treat what an export allocates
    // only after the first ones (see detachRows in libs/store).
    const runs = [];
    for (let run = 0; run < 3; run += 1) {
      const rssBefore = processRssKiB(gateway.pid);
      let rssMax = rssBefore;
      const sampler = setInterval(() => {
        rssMax = Math.max(rssMax, processRssKiB(gateway.pid));
      }, 50);
      const started = performance.now();
      const response = await fetch(`${gateway.url}/api/users/${USER}/export`, {
        headers: { authorization: `Bearer ${token}` },
      });
      if (response.status !== 200) throw new Error(`export answered ${response.status}`);
      const lines = await countLines(response.body);
      const seconds = (performance.now() - started) / 1000;
      clearInterval(sampler);
      rssMax = Math.max(rssMax, processRssKiB(gateway.pid));
      // Each conversation is its info, its events and its state; then the user's state.
      const exportedEvents = lines - 2 * conversations - 1;
      const result = {
        lines,
        events: exportedEvents,
        seconds: round(seconds),
        eventsPerSecond: Math.round(exportedEvents / seconds),
        rssBeforeMiB: round(rssBefore / 1024),
        rssGrowthMiB: round((rssMax - rssBefore) / 1024),
      };
      runs.push(result);
      log(
        `  export ${run + 1}: ${exportedEvents} events (${lines} lines) in ${result.seconds} s:` +
          ` ${result.eventsPerSecond} events/s; gateway RSS ${result.rssBeforeMiB} MiB, grew at most ${result.rssGrowthMiB} MiB`,
      );
    }
    const worst = {
      eventsPerSecond: Math.min(...runs.map((r) => r.eventsPerSecond)),
      rssGrowthMiB: Math.max(...runs.map((r) => r.rssGrowthMiB)),
    };
    return { conversations, eventsPerConversation: events, runs, worst };
  } finally {
    await opened.close();
  }
}

const RETENTION_USER = 'retention';
const RETENTION_RATE = 500;
/** The longest the load runs while the sweep goes on. */
const SWEEP_WINDOW_MS = 600_000;

/** How many of the retention user's conversations are left. */
async function retained(db) {
  const { rows } = await db.query(
    'SELECT count(*)::int AS n FROM conversations WHERE tenant_id = $1 AND user_id = $2',
    [TENANT, RETENTION_USER],
  );
  return rows[0].n;
}

/** What a paced run of the load gives the report. */
function loadFigures(run) {
  return {
    latency: summarize(run.samples),
    throughput: { value: run.throughput, unit: 'msg/s' },
    errors: run.errors,
    firstError: run.firstError,
    windowS: round(run.windowS),
    cpu: run.cpu,
  };
}

export async function runRetention(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? 500 : options.retentionConversations;
  const events = 100;
  const clientsWanted = options.quick ? 100 : options.sustainedConversations;
  const rate = options.quick ? 100 : RETENTION_RATE;
  const baselineMs = (options.quick ? 5 : options.durationS) * 1000;
  const gateway = cluster.gateways[0];
  const token = await ctx.token(RETENTION_USER);
  const clients = [];
  try {
    // One conversation stored through the service, copied in SQL: rows as the service writes them.
    const seedStarted = performance.now();
    const templateId = await createConversation(gateway.url, token, { title: 'idle 0' });
    const opened = await openHistoryStore(cluster);
    try {
      await seedHistory(opened.store, TENANT, templateId, -1, events);
    } finally {
      await opened.close();
    }
    await cloneHistory(cluster.db, templateId, count - 1, { title: 'idle' });
    await cluster.db.query('ANALYZE conversations');
    const seedS = round((performance.now() - seedStarted) / 1000);
    log(
      `  seeded ${count} conversations × ${events} events in ${seedS} s (one, then copies in SQL)`,
    );

    const failedToOpen = await openConversations(ctx, clients, 0, clientsWanted);
    const ready = clients.filter((c) => c.readyAt !== null && c.socket.connected);
    log(`  load: ${ready.length} conversations at ${rate} msg/s (${failedToOpen} failed to open)`);
    const baseline = loadFigures(await drive(ctx, ready, baselineMs, rate));
    log(
      `  without a sweep: ${baseline.throughput.value} msg/s  ${formatSummary(baseline.latency)}  errors ${baseline.errors}`,
    );
    log(`    ${formatCpu(baseline.cpu)}`);

    // Idle from now on: the next sweep (every 2 s) finds them all.
    await cluster.db.query(
      "UPDATE conversations SET updated_at = now() - interval '2 days' WHERE tenant_id = $1 AND user_id = $2",
      [TENANT, RETENTION_USER],
    );
    const sweepStarted = performance.now();
    let left = count;
    let sweptAt = null;
    const swept = (async () => {
      while (left > 0 && performance.now() - sweepStarted < SWEEP_WINDOW_MS) {
        await sleep(250);
        left = await retained(cluster.db);
      }
      sweptAt = left === 0 ? performance.now() : null;
    })();
    const during = loadFigures(await drive(ctx, ready, SWEEP_WINDOW_MS, rate, { ends: swept }));
    await swept;
    const sweepS = round(((sweptAt ?? performance.now()) - sweepStarted) / 1000);
    const deleted = count - left;
    const ratio =
      baseline.latency.p99 && during.latency.p99
        ? round(during.latency.p99 / baseline.latency.p99)
        : null;
    log(
      `  during the sweep: ${during.throughput.value} msg/s  ${formatSummary(during.latency)}  errors ${during.errors}`,
    );
    log(`    ${formatCpu(during.cpu)}`);
    log(
      `  swept ${deleted} of ${count} idle conversations in ${sweepS} s: ${Math.round(deleted / sweepS)} conversations/s;` +
        ` p99 during / without: ${during.latency.p99} / ${baseline.latency.p99} ms = ×${ratio}`,
    );
    return {
      conversations: count,
      events,
      seedS,
      offeredRate: rate,
      loadConversations: ready.length,
      failedToOpen,
      baseline,
      during,
      p99Ratio: ratio,
      deleted,
      left,
      sweepS,
      conversationsPerSecond: round(deleted / sweepS),
    };
  } finally {
    await closeConversations(clients);
  }
}
