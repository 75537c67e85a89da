// The export of a user (PROTOCOL.md "Data lifecycle"): a user with 100
// conversations of 1,000 events each (written straight into the run's
// database, bench/lib/history.mjs), exported by `GET /api/users/:id/export`
// from one gateway: events per second through the whole NDJSON stream, read
// as it arrives, and the growth of that gateway's RSS over the export
// (sampled every 50 ms; the target: at most 50 MB, whatever the user holds).
import { HISTORY_BATCH, openHistoryStore, seedHistory } from '../lib/history.mjs';
import { api, createConversation, mapLimit } from '../lib/client.mjs';
import { processRssKiB } from '../lib/proc.mjs';
import { round } from '../lib/stats.mjs';

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
