// Conversations with long histories (10,000 events each): what a worker keeps
// in memory per hosted conversation, and how long restoring one to
// `awaiting_user_input` takes. The histories are written straight into this
// run's database through the service's own store (bench/lib/history.mjs).
// Then each
// conversation is started on fresh workers by a client that connects with
// `latest_event_id` at its last event (so no replay is sent), and is left
// hosted, idle; the workers' RSS and V8 heap before and after, each read
// right after a forced full GC (the bench agent module's probe, so that
// garbage not collected yet does not count), tell the memory per
// conversation.
import { HISTORY_BATCH, openHistoryStore, seedHistory } from '../lib/history.mjs';
import {
  ConversationSocket,
  api,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

const SETTLE_MS = 3000;
const READY_TIMEOUT_MS = 30_000;
/** Conversations restored and stopped on the fresh workers before the measurement. */
const WARMUP_CONVERSATIONS = 10;
const TENANT = 'bench';
const USER = 'long-history';

/** The workers' memory after a forced full GC, summed (KiB), from the bench agent module's probe. */
async function probedKiB(workers) {
  const probes = await Promise.all(workers.map((worker) => worker.probeMemory()));
  const sum = (key) => probes.reduce((total, probe) => total + probe[key], 0) / 1024;
  return { rss: sum('rss'), heapUsed: sum('heapUsed'), external: sum('external') };
}

/** Fresh workers in place of the running ones: a grown heap would hide new objects. */
async function freshWorkers(ctx) {
  const { cluster, log } = ctx;
  const old = [...cluster.workers];
  // With the memory probe of the bench agent module (a forced GC, then process.memoryUsage()).
  await Promise.all(old.map(() => cluster.startWorker({ BENCH_MEMORY_PROBE: '1' })));
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
      const stopped = await stopConversation(url, token, id);
      // A stop that gave up waiting leaves a run finishing while the restore below starts.
      if (stopped?.conversation_status !== 'STOPPED')
        log(`  warm-up ${i}: the stop answered ${JSON.stringify(stopped)}`);
    }
    await sleep(SETTLE_MS);
    const before = await probedKiB(workers);

    // Restore each one, one at a time, as a client that has every event already.
    const readies = [];
    let errors = 0;
    const meter = startCpuMeter(() => cluster.meterTargets());
    for (const [i, id] of ids.entries()) {
      const url = gateways[i % gateways.length].url;
      let info = await api(url, token, 'GET', `/api/conversations/${id}`);
      if (info.status !== 'STOPPED') {
        // Started again since its warm-up stop (seen in CI: RUNNING and awaiting_user_input
        // before this restore, so that it would never get ready): told, and stopped first,
        // so that what is measured is a restore.
        log(
          `  restore ${i}: was ${info.status} (agent state ${info.agent_state}) before it; stopped it first`,
        );
        await stopConversation(url, token, id);
        info = await api(url, token, 'GET', `/api/conversations/${id}`);
      }
      const latest = info.last_event_id;
      const socket = new ConversationSocket(url, token, id, { latestEventId: latest });
      try {
        await socket.connected;
        const readyAt = await socket.ready(READY_TIMEOUT_MS);
        readies.push(readyAt - socket.openedAt);
      } catch (error) {
        errors += 1;
        if (errors <= 3) {
          // What the service says of it, to tell a lost start from a slow one.
          const info = await api(url, token, 'GET', `/api/conversations/${id}`).catch(() => null);
          const redis = ctx.cluster.redisClient();
          const job = await redis
            .exists(ctx.cluster.conversationJobKey(id))
            .catch(() => '?')
            .finally(() => redis.disconnect());
          log(
            `  restore ${i}: ${String(error)} (status ${info?.status}, agent state ${info?.agent_state}, ` +
              `last event ${info?.last_event_id}, socket got ${socket.received} events, job key ${job})`,
          );
        }
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
    const after = await probedKiB(workers);
    const per = (key) => (hosted > 0 ? round((after[key] - before[key]) / hosted) : null);
    const perConversationKiB = per('rss');
    const heapPerConversationKiB = per('heapUsed');
    const latency = summarize(readies);
    const stored = summarize(await storedRestoreTimes(cluster, ids));
    log(`  connect → awaiting_user_input (${events} events stored)  ${formatSummary(latency)}`);
    log(`  stored loading → awaiting_user_input                  ${formatSummary(stored)}`);
    log(
      `  ${workers.length} worker(s): ${hosted} conversations of ${events} events hosted:` +
        ` after a forced GC, RSS ${Math.round(before.rss / 1024)} → ${Math.round(after.rss / 1024)} MiB,` +
        ` ${perConversationKiB} KiB per conversation; V8 heap used ${Math.round(before.heapUsed / 1024)} →` +
        ` ${Math.round(after.heapUsed / 1024)} MiB, ${heapPerConversationKiB} KiB per conversation;` +
        ` external ${per('external')} KiB per conversation`,
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
      rssBeforeMiB: round(before.rss / 1024),
      rssAfterMiB: round(after.rss / 1024),
      perConversationKiB,
      heapBeforeMiB: round(before.heapUsed / 1024),
      heapAfterMiB: round(after.heapUsed / 1024),
      heapPerConversationKiB,
      externalPerConversationKiB: per('external'),
      measuredAfterGc: true,
      cpu,
    };
  } finally {
    await mapLimit(ids, 20, (id) =>
      stopConversation(gateways[0].url, token, id).catch(() => undefined),
    );
    await opened.close();
  }
}
