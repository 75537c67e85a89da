// Memory per idle unit: a gateway's RSS per connected socket (sockets that
// attach without starting the agent) and a worker's RSS per hosted
// conversation (started through REST, no client), from /proc/<pid>/status
// before and after, on processes that ran nothing else: after other scenarios
// a grown heap would hide new objects in its free space. Also the CPU the
// idle conversations cost their workers, Postgres and the machine (a worker
// reads where its hosted conversations stand every few seconds).
import {
  ConversationSocket,
  api,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { cpuByRole, formatCpu, processRssKiB, startCpuMeter } from '../lib/proc.mjs';
import { round } from '../lib/stats.mjs';
import { cpus } from 'node:os';

const SETTLE_MS = 3000;
const IDLE_CPU_WINDOW_MS = 10_000;
/** A Postgres backend idle since its last transaction reports it within 10 s (PGSTAT_IDLE_INTERVAL). */
const STATS_FLUSH_MS = 10_500;

/** Transactions of this database so far (statistics lag by up to a second). */
export async function transactions(cluster) {
  const { rows } = await cluster.db.query(
    'SELECT (xact_commit + xact_rollback)::float8 AS n FROM pg_stat_database WHERE datname = current_database()',
  );
  return rows[0]?.n ?? 0;
}
const SOCKETS_PER_CONVERSATION = 10;

const sumRss = (processes) => processes.reduce((sum, p) => sum + (processRssKiB(p.pid) ?? 0), 0);

/**
 * `count` idle sockets on `gateway`; `idleWindowMs`: how long their idle CPU is measured.
 */
export async function gatewaySockets(ctx, gateway, measure = {}) {
  const { options, log } = ctx;
  const count =
    measure.count ?? (options.quick ? Math.min(500, options.memorySockets) : options.memorySockets);
  const idleWindowMs = measure.idleWindowMs ?? IDLE_CPU_WINDOW_MS;
  const token = await ctx.token('memory-sockets');
  const conversations = await mapLimit(
    Array.from({ length: Math.ceil(count / SOCKETS_PER_CONVERSATION) }, (_, i) => i),
    10,
    (i) => createConversation(gateway.url, token, { title: `memory sockets ${i}` }),
  );
  await sleep(SETTLE_MS);
  const before = processRssKiB(gateway.pid);
  const benchBefore = process.memoryUsage().rss / 1024;
  const sockets = [];
  let failed = 0;
  const started = performance.now();
  try {
    await mapLimit(
      Array.from({ length: count }, (_, i) => i),
      50,
      async (i) => {
        const socket = new ConversationSocket(
          gateway.url,
          token,
          conversations[i % conversations.length],
          { latestEventId: -1, start: false },
        );
        sockets.push(socket);
        try {
          await socket.connected;
        } catch {
          failed += 1;
        }
      },
    );
    const connectS = round((performance.now() - started) / 1000);
    await sleep(SETTLE_MS);
    const after = processRssKiB(gateway.pid);
    const benchAfter = process.memoryUsage().rss / 1024;
    const connected = sockets.filter((s) => s.socket.connected).length;
    const meter = startCpuMeter([gateway]);
    await sleep(idleWindowMs);
    const idleCpu = meter.stop();
    const perSocketKiB = connected > 0 ? round((after - before) / connected) : null;
    log(
      `  ${gateway.name}: ${connected} idle sockets (${failed} failed, connected in ${connectS} s):` +
        ` RSS ${Math.round(before / 1024)} → ${Math.round(after / 1024)} MiB, ${perSocketKiB} KiB per socket;` +
        ` idle CPU ${idleCpu.processes[gateway.name]}%`,
    );
    return {
      sockets: connected,
      failed,
      rssBeforeMiB: round(before / 1024),
      rssAfterMiB: round(after / 1024),
      perSocketKiB,
      clientPerSocketKiB: connected > 0 ? round((benchAfter - benchBefore) / connected) : null,
      idleCpuPercent: idleCpu.processes[gateway.name],
      connectS,
    };
  } finally {
    for (const socket of sockets) socket.close();
  }
}

/**
 * `count` hosted idle conversations; their idle CPU and Postgres transactions
 * are measured over `idleWindowMs` (before and with them).
 */
export async function workerConversations(ctx, measure = {}) {
  const { cluster, options, log } = ctx;
  const count =
    measure.count ??
    (options.quick ? Math.min(300, options.memoryConversations) : options.memoryConversations);
  const idleWindowMs = measure.idleWindowMs ?? IDLE_CPU_WINDOW_MS;
  const gateways = cluster.gateways;
  const token = await ctx.token('memory-conversations');
  const workers = cluster.workers;
  await sleep(STATS_FLUSH_MS);
  const idleBefore = startCpuMeter(() => cluster.meterTargets());
  const txBefore0 = await transactions(cluster);
  await sleep(idleWindowMs);
  const txRateBefore = ((await transactions(cluster)) - txBefore0) / (idleWindowMs / 1000);
  const cpuBefore = idleBefore.stop();
  const before = sumRss(workers);
  const ids = [];
  const started = performance.now();
  try {
    await mapLimit(
      Array.from({ length: count }, (_, i) => i),
      20,
      async (i) => {
        const url = gateways[i % gateways.length].url;
        const id = await createConversation(url, token, { title: `memory conversations ${i}` });
        ids.push(id);
        await api(url, token, 'POST', `/api/conversations/${id}/start`, {});
      },
    );
    const wanted = new Set(ids);
    let hosted = 0;
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      const holdings = await cluster.holdings();
      hosted = 0;
      for (const held of holdings.values()) for (const id of held) if (wanted.has(id)) hosted += 1;
      if (hosted >= ids.length) break;
      await sleep(500);
    }
    const startS = round((performance.now() - started) / 1000);
    await sleep(SETTLE_MS);
    const after = sumRss(workers);
    await sleep(STATS_FLUSH_MS - SETTLE_MS); // the starts' transactions are counted before the window
    const meter = startCpuMeter(() => cluster.meterTargets());
    const tx0 = await transactions(cluster);
    await sleep(idleWindowMs);
    const txRate = ((await transactions(cluster)) - tx0) / (idleWindowMs / 1000);
    const idleCpu = meter.stop();
    const perConversationKiB = hosted > 0 ? round((after - before) / hosted) : null;
    const idle = cpuByRole(idleCpu);
    const idleBase = cpuByRole(cpuBefore);
    const pollCost = idle.workers + idle.postgres - idleBase.workers - idleBase.postgres;
    log(
      `  ${workers.length} worker(s): ${hosted} idle conversations hosted (started in ${startS} s):` +
        ` RSS ${Math.round(before / 1024)} → ${Math.round(after / 1024)} MiB, ${perConversationKiB} KiB per conversation`,
    );
    log(
      `  idle CPU (% of one core) with none → with ${hosted}: workers ${idleBase.workers} → ${idle.workers},` +
        ` postgres ${idleBase.postgres} → ${idle.postgres}, redis ${idleBase.redis} → ${idle.redis};` +
        ` machine ${cpuBefore.machine} → ${idleCpu.machine} of ${100 * cpus().length}`,
    );
    log(
      `  Postgres transactions/s of this database while idle: ${Math.round(txRateBefore)} → ${Math.round(txRate)}`,
    );
    log(`  ${formatCpu(idleCpu)}`);
    return {
      conversations: hosted,
      rssBeforeMiB: round(before / 1024),
      rssAfterMiB: round(after / 1024),
      perConversationKiB,
      idleCpuBefore: idleBase,
      idleCpu: idle,
      idleTransactionsPerSecondBefore: Math.round(txRateBefore),
      idleTransactionsPerSecond: Math.round(txRate),
      idleCpuPerThousand: hosted > 0 ? round((pollCost / hosted) * 1000) : null,
      startS,
    };
  } finally {
    await mapLimit(ids, 20, (id) =>
      stopConversation(gateways[0].url, token, id).catch(() => undefined),
    );
  }
}

/**
 * Replaces the cluster's processes by fresh ones when earlier scenarios ran:
 * a new gateway is measured, and new workers take over from the old ones.
 */
async function freshProcesses(ctx) {
  const { cluster, log } = ctx;
  if (Object.keys(ctx.results).length === 0) return cluster.gateways[0];
  const old = [...cluster.workers];
  const [gateway] = await Promise.all([
    cluster.startGateway(),
    ...old.map(() => cluster.startWorker()),
  ]);
  await Promise.all(old.map((worker) => cluster.stopWorker(worker, 'SIGTERM')));
  log(
    `  measured on fresh processes: ${gateway.name}, ${cluster.workers.map((w) => w.name).join(', ')}`,
  );
  return gateway;
}

export async function runMemory(ctx) {
  const gateway = await gatewaySockets(ctx, await freshProcesses(ctx));
  const worker = await workerConversations(ctx);
  return { gateway, worker };
}
