// Conversations with long histories (10,000 events each): what a worker keeps
// in memory per hosted conversation, and how long restoring one to
// `awaiting_user_input` takes. The histories are written straight into this
// run's database through the service's own store (bench/lib/history.mjs).
// Then each
// conversation is started on fresh workers by a client that connects with
// `latest_event_id` at its last event (so no replay is sent), and is left
// hosted, idle; the workers' RSS (and V8 heap, from their metrics) before and
// after tells the memory per conversation.
import { HISTORY_BATCH, openHistoryStore, seedHistory } from '../lib/history.mjs';
import {
  ConversationSocket,
  api,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatCpu, processRssKiB, startCpuMeter } from '../lib/proc.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

const SETTLE_MS = 3000;
const READY_TIMEOUT_MS = 30_000;
/** Conversations restored and stopped on the fresh workers before the measurement. */
const WARMUP_CONVERSATIONS = 10;
const TENANT = 'bench';
const USER = 'long-history';

const sumRss = (processes) => processes.reduce((sum, p) => sum + (processRssKiB(p.pid) ?? 0), 0);

/** V8 heap in use (KiB) summed over the workers, from their `/metrics`. */
async function heapUsedKiB(workers) {
  const values = await Promise.all(
    workers.map(async (worker) => {
      try {
        const response = await fetch(`${worker.url}/metrics`, {
          signal: AbortSignal.timeout(5000),
        });
        const text = await response.text();
        const match = /^cs_nodejs_heap_size_used_bytes(?:\{[^}]*\})?\s+(\S+)/m.exec(text);
        return match ? Number(match[1]) / 1024 : 0;
      } catch {
        return 0;
      }
    }),
  );
  return values.reduce((a, b) => a + b, 0);
}

/** Fresh workers in place of the running ones: a grown heap would hide new objects. */
async function freshWorkers(ctx) {
  const { cluster, log } = ctx;
  const old = [...cluster.workers];
  await Promise.all(old.map(() => cluster.startWorker()));
  await Promise.all(old.map((worker) => cluster.stopWorker(worker, 'SIGTERM')));
  log(`  fresh workers: ${cluster.workers.map((w) => w.name).join(', ')}`);
}

/** The stored `loading` → `awaiting_user_input` of each conversation's last start (ms). */
async function storedRestoreTimes(cluster, ids) {
  const { rows } = await cluster.db.query(
    `SELECT conversation_id::text AS cid, payload->'extras'->>'agent_state' AS state,
            (extract(epoch FROM created_at) * 1000)::float8 AS at
       FROM events
      WHERE conversation_id = ANY($1::uuid[]) AND type = 'agent_state_changed'
        AND payload->'extras'->>'agent_state' IN ('loading', 'awaiting_user_input')
      ORDER BY conversation_id, id`,
    [ids],
  );
  const loadingAt = new Map();
  const spans = new Map();
  for (const row of rows) {
    if (row.state === 'loading') loadingAt.set(row.cid, row.at);
    else if (loadingAt.has(row.cid)) spans.set(row.cid, row.at - loadingAt.get(row.cid));
  }
  return [...spans.values()];
}

export async function runLongHistory(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick
    ? Math.min(5, options.historyConversations)
    : options.historyConversations;
  const events = options.historyEvents;
  const gateways = cluster.gateways;
  const token = await ctx.token(USER);
  const opened = await openHistoryStore(cluster);
  const ids = [];
  try {
    // Seed the histories.
    const seedStarted = performance.now();
    const lastIds = new Map();
    await mapLimit(
      Array.from({ length: count }, (_, i) => i),
      4,
      async (i) => {
        const url = gateways[i % gateways.length].url;
        const id = await createConversation(url, token, { title: `long history ${i}` });
        ids.push(id);
        const info = await api(url, token, 'GET', `/api/conversations/${id}`);
        const seeded = await seedHistory(opened.store, TENANT, id, info.last_event_id, events);
        lastIds.set(id, seeded.lastId);
      },
    );
    const seedS = round((performance.now() - seedStarted) / 1000);
    log(
      `  seeded ${count} conversations × ${events} events in ${seedS} s (store.append, ${HISTORY_BATCH} a batch)`,
    );

    await freshWorkers(ctx);
    const workers = cluster.workers;
    // Warm-up: restore some of them and stop them again, so that what is measured is per
    // conversation (code compiled, pools opened, V8's young generation grown to its working size).
    for (const [i, id] of ids.slice(0, WARMUP_CONVERSATIONS).entries()) {
      const url = gateways[i % gateways.length].url;
      const socket = new ConversationSocket(url, token, id, { latestEventId: lastIds.get(id) });
      try {
        await socket.connected;
        await socket.ready(READY_TIMEOUT_MS);
      } finally {
        socket.close();
      }
      await stopConversation(url, token, id);
    }
    await sleep(SETTLE_MS);
    const rssBefore = sumRss(workers);
    const heapBefore = await heapUsedKiB(workers);

    // Restore each one, one at a time, as a client that has every event already.
    const readies = [];
    let errors = 0;
    const meter = startCpuMeter(() => cluster.meterTargets());
    for (const [i, id] of ids.entries()) {
      const url = gateways[i % gateways.length].url;
      const { last_event_id: latest } = await api(url, token, 'GET', `/api/conversations/${id}`);
      const socket = new ConversationSocket(url, token, id, { latestEventId: latest });
      try {
        await socket.connected;
        const readyAt = await socket.ready(READY_TIMEOUT_MS);
        readies.push(readyAt - socket.openedAt);
      } catch (error) {
        errors += 1;
        if (errors <= 3) log(`  restore ${i}: ${String(error)}`);
      } finally {
        socket.close();
      }
    }
    const cpu = meter.stop();
    await sleep(SETTLE_MS);
    const holdings = await cluster.holdings();
    const wanted = new Set(ids);
    let hosted = 0;
    for (const held of holdings.values()) for (const id of held) if (wanted.has(id)) hosted += 1;
    const rssAfter = sumRss(workers);
    const heapAfter = await heapUsedKiB(workers);
    const perConversationKiB = hosted > 0 ? round((rssAfter - rssBefore) / hosted) : null;
    const heapPerConversationKiB = hosted > 0 ? round((heapAfter - heapBefore) / hosted) : null;
    const latency = summarize(readies);
    const stored = summarize(await storedRestoreTimes(cluster, ids));
    log(`  connect → awaiting_user_input (${events} events stored)  ${formatSummary(latency)}`);
    log(`  stored loading → awaiting_user_input                  ${formatSummary(stored)}`);
    log(
      `  ${workers.length} worker(s): ${hosted} conversations of ${events} events hosted:` +
        ` RSS ${Math.round(rssBefore / 1024)} → ${Math.round(rssAfter / 1024)} MiB, ${perConversationKiB} KiB per conversation;` +
        ` V8 heap used ${Math.round(heapBefore / 1024)} → ${Math.round(heapAfter / 1024)} MiB, ${heapPerConversationKiB} KiB per conversation`,
    );
    log(`  ${formatCpu(cpu)}`);
    return {
      conversations: count,
      events,
      hosted,
      seedS,
      latency,
      stored,
      errors,
      rssBeforeMiB: round(rssBefore / 1024),
      rssAfterMiB: round(rssAfter / 1024),
      perConversationKiB,
      heapBeforeMiB: round(heapBefore / 1024),
      heapAfterMiB: round(heapAfter / 1024),
      heapPerConversationKiB,
      cpu,
    };
  } finally {
    await mapLimit(ids, 20, (id) =>
      stopConversation(gateways[0].url, token, id).catch(() => undefined),
    );
    await opened.close();
  }
}
