// The data lifecycle (docs/protocol.md "Data lifecycle").
// - user-export: a user with 100 conversations of 1,000 events each (written
//   straight into the run's database, bench/lib/history.mjs), exported by
//   `GET /api/users/:id/export` from one gateway: events per second through
//   the whole NDJSON stream, read as it arrives, and the growth of that
//   gateway's RSS over the export (sampled every 50 ms; the target: at most
//   50 MB, whatever the user holds).
// - retention: conversations of 100 events made idle at once (their activity
//   set 2 days back, the cluster runs with RETENTION_DAYS=1 and a 2 s sweep
//   interval) while one client sends round trips without pause: how fast the
//   sweep deletes them, and the round trip's p99 during the sweep beside
//   before it.
import { HISTORY_BATCH, openHistoryStore, seedHistory } from '../lib/history.mjs';
import { api, connectConversation, createConversation, mapLimit } from '../lib/client.mjs';
import { processRssKiB } from '../lib/proc.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

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
    // A warm-up export of one conversation: code compiled, statements prepared.
    const runs = [];
    for (let run = 0; run < 2; run += 1) {
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
    return { conversations, eventsPerConversation: events, runs };
  } finally {
    await opened.close();
  }
}

/** Round trips without pause until `until()` says stop; their total times (ms). */
async function roundTripsWhile(conversation, until, label) {
  const totals = [];
  for (let i = 0; !until(); i += 1) {
    const trip = await conversation.roundTrip(`${label} ${i}`);
    totals.push(trip.total);
  }
  return totals;
}

export async function runRetention(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? 200 : 2000;
  const events = 100;
  const gateway = cluster.gateways[0];
  const token = await ctx.token('retention');
  const probeToken = await ctx.token('retention-probe');
  const opened = await openHistoryStore(cluster);
  const probeId = await createConversation(gateway.url, probeToken, { title: 'probe' });
  const probe = await connectConversation(gateway.url, probeToken, probeId);
  try {
    await probe.ready(20_000);
    const seedStarted = performance.now();
    await mapLimit(
      Array.from({ length: count }, (_, i) => i),
      6,
      async (i) => {
        const url = cluster.gateways[i % cluster.gateways.length].url;
        const id = await createConversation(url, token, { title: `idle ${i}` });
        await seedHistory(opened.store, 'bench', id, -1, events);
      },
    );
    log(
      `  seeded ${count} conversations × ${events} events in ${round((performance.now() - seedStarted) / 1000)} s`,
    );
    for (let i = 0; i < 200; i += 1) await probe.roundTrip(`warm-up ${i}`);
    const baselineEnd = performance.now() + 10_000;
    const baseline = summarize(
      await roundTripsWhile(probe, () => performance.now() > baselineEnd, 'before'),
    );
    log(`  round trip before the sweep   ${formatSummary(baseline)}`);
    const remaining = async () =>
      Number(
        (
          await cluster.db.query(
            "SELECT count(*) AS n FROM conversations WHERE tenant_id = 'bench' AND user_id = 'retention'",
          )
        ).rows[0].n,
      );
    await cluster.db.query(
      "UPDATE conversations SET updated_at = now() - interval '2 days' WHERE tenant_id = 'bench' AND user_id = 'retention'",
    );
    const started = performance.now();
    let left = count;
    let done = false;
    const watcher = (async () => {
      while (left > 0 && performance.now() - started < 600_000) {
        await new Promise((resolve) => setTimeout(resolve, 200));
        left = await remaining();
      }
      done = true;
    })();
    const during = summarize(await roundTripsWhile(probe, () => done, 'during'));
    await watcher;
    const seconds = (performance.now() - started) / 1000;
    log(
      `  swept ${count - left} of ${count} idle conversations (${events} events each) in ${round(seconds)} s:` +
        ` ${Math.round((count - left) / seconds)} conversations/s`,
    );
    log(`  round trip during the sweep   ${formatSummary(during)}`);
    return { conversations: count, events, left, seconds: round(seconds), baseline, during };
  } finally {
    probe.close();
    await opened.close();
  }
}
