// The service on a local Redis Cluster (3 masters with a replica each,
// bench/lib/redis-cluster.mjs) with CONVERSATION_QUEUES=8, beside the one
// Redis of the same run: the round trip and the sustained load as on one
// Redis, the failover after kill -9 of a worker, and kill -9 of a Redis
// master under load: every acknowledged message answered, and how soon the
// conversations whose keys or queue sat on that master are answered again.
import calculateSlot from 'cluster-key-slot';
import { createConversation, mapLimit, postMessage, stopConversation } from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import {
  CLUSTER_NODE_TIMEOUT_MS,
  redisClusterAvailable,
  startRedisCluster,
} from '../lib/redis-cluster.mjs';
import { withSideCluster } from '../lib/side-cluster.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { runRoundTrip } from './conversation-latency.mjs';
import { runFailover, settledCount } from './failover.mjs';
import { runSustained } from './sustained.mjs';
import {
  conversationQueueIndex,
  conversationQueueNames,
} from '../../dist/libs/cluster/src/leases/conversation-queues.js';

export const CLUSTER_QUEUES = 8;
/** The issue's bound on the round trip p50: this × one Redis's of the same run. */
export const ROUND_TRIP_RATIO_BOUND = 1.3;
/** After kill -9 of a master, the first answer within the node timeout + this. */
const MASTER_KILL_SLACK_MS = 3_000;

const ANSWERS_SQL = `
  SELECT e.conversation_id::text AS id, e.cause::text AS cause,
         (extract(epoch FROM e.created_at) * 1000)::float8 AS at
    FROM unnest($1::uuid[], $2::bigint[]) AS t(cid, uid)
    JOIN events e ON e.conversation_id = t.cid AND e.cause = t.uid
   WHERE e.source = 'agent' AND e.type = 'message'`;

/** Polls Postgres for the answers of `sent` ({ id, eventId }); returns "<id>/<eventId>" → answer time (epoch ms). */
async function answersOf(cluster, sent, deadline) {
  const answered = new Map();
  for (;;) {
    const pending = sent.filter((s) => !answered.has(`${s.id}/${s.eventId}`));
    if (pending.length === 0 || Date.now() > deadline) return answered;
    const { rows } = await cluster.db.query(ANSWERS_SQL, [
      pending.map((s) => s.id),
      pending.map((s) => s.eventId),
    ]);
    for (const row of rows) answered.set(`${row.id}/${row.cause}`, row.at);
    if (answered.size < sent.length) await sleep(100);
  }
}

export async function runRedisCluster(ctx) {
  const { log, options } = ctx;
  if (!redisClusterAvailable()) throw new Error('needs redis-server and redis-cli (Debian redis)');
  const redisCluster = await startRedisCluster();
  try {
    log(`  3 masters + 3 replicas on ports ${redisCluster.nodes.map((n) => n.port).join(', ')}`);
    return await withSideCluster(
      ctx,
      { redisCluster, conversationQueues: CLUSTER_QUEUES },
      async (side) => {
        log('  round trip on the Redis Cluster:');
        const roundTrip = await runRoundTrip(side);
        log('  sustained load on the Redis Cluster:');
        const sustained = await runSustained(side);
        log('  failover (kill -9 of a worker) on the Redis Cluster:');
        const failover = options.workers >= 2 ? await runFailover(side, 'SIGKILL') : null;
        log('  kill -9 of a Redis master under load:');
        const masterKill = await runMasterKill(side, redisCluster);
        const single = ctx.results['round-trip']?.latency?.p50 ?? null;
        const ratio = single ? round(roundTrip.latency.p50 / single) : null;
        log(
          `  round trip p50: ${roundTrip.latency.p50} ms on the cluster` +
            (single
              ? ` vs ${single} ms on one Redis: ×${ratio} (bound ×${ROUND_TRIP_RATIO_BOUND})`
              : ' (run round-trip too for the comparison with one Redis)'),
        );
        return {
          masters: 3,
          queues: CLUSTER_QUEUES,
          nodeTimeoutMs: CLUSTER_NODE_TIMEOUT_MS,
          roundTrip,
          roundTripRatio: ratio,
          sustained,
          failover,
          masterKill,
          latency: roundTrip.latency,
        };
      },
    );
  } finally {
    await redisCluster.stop();
  }
}

/** Conversations of the load: running, no client, a message each every `periodMs` through REST. */
async function runMasterKill(ctx, redisCluster) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? 24 : 60;
  const periodMs = options.quick ? 300 : 200;
  const token = await ctx.token('master-kill');
  const gateways = cluster.gateways;
  const ids = await mapLimit(
    Array.from({ length: count }, (_, i) => i),
    16,
    (i) =>
      createConversation(gateways[i % gateways.length].url, token, {
        title: `master kill ${i}`,
        initial_user_msg: 'hello',
      }),
  );
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; await sleep(200)) {
    if ((await settledCount(cluster, ids)) === ids.length) break;
  }
  try {
    const [victim] = await redisCluster.masters();
    const ranges = await redisCluster.slotsOf(victim.port);
    const onVictim = (slot) => ranges.some(([from, to]) => slot >= from && slot <= to);
    const queues = conversationQueueNames(CLUSTER_QUEUES);
    const affected = new Set(
      ids.filter(
        (id) =>
          onVictim(calculateSlot(id)) ||
          onVictim(calculateSlot(queues[conversationQueueIndex(id, CLUSTER_QUEUES)])),
      ),
    );
    const acked = [];
    let refused = 0;
    let firstRefusal = null;
    const loadMs = 2_000 + 2 * CLUSTER_NODE_TIMEOUT_MS + 6_000;
    const started = Date.now();
    let killedAt = null;
    const load = Promise.all(
      ids.map(async (id, i) => {
        await sleep(Math.random() * periodMs);
        for (let k = 0; Date.now() - started < loadMs; k += 1) {
          const sentAt = Date.now();
          try {
            const eventId = await postMessage(
              gateways[i % gateways.length].url,
              token,
              id,
              `master kill ${i}.${k}`,
            );
            acked.push({ id, eventId, sentAt });
          } catch (error) {
            refused += 1;
            firstRefusal ??= String(error);
          }
          await sleep(Math.max(0, sentAt + periodMs - Date.now()));
        }
      }),
    );
    await sleep(2_000);
    killedAt = Date.now();
    await redisCluster.kill(victim);
    log(
      `  killed master :${victim.port} (slots ${ranges.map(([a, b]) => `${a}-${b}`).join(', ')});` +
        ` ${affected.size} of ${ids.length} conversations have keys or their queue there`,
    );
    await load;
    const answers = await answersOf(cluster, acked, Date.now() + 30_000);
    const unanswered = acked.filter((a) => !answers.has(`${a.id}/${a.eventId}`)).length;
    // Per conversation: the first answer to a message sent after the kill.
    const firstAfter = new Map();
    for (const a of acked) {
      if (a.sentAt < killedAt) continue;
      const at = answers.get(`${a.id}/${a.eventId}`);
      if (at === undefined) continue;
      const ms = at - killedAt;
      if (!firstAfter.has(a.id) || firstAfter.get(a.id) > ms) firstAfter.set(a.id, ms);
    }
    const firstOf = (list) => list.map((id) => firstAfter.get(id)).filter((ms) => ms !== undefined);
    const affectedFirst = summarize(firstOf([...affected]));
    const othersFirst = summarize(firstOf(ids.filter((id) => !affected.has(id))));
    const boundMs = CLUSTER_NODE_TIMEOUT_MS + MASTER_KILL_SLACK_MS;
    log(`  kill → first answer, conversations on it   ${formatSummary(affectedFirst)}`);
    log(`  kill → first answer, the others            ${formatSummary(othersFirst)}`);
    log(
      `  ${acked.length} messages acknowledged, ${unanswered} unanswered; ${refused} refused` +
        ` (not stored)${firstRefusal ? `, first: ${firstRefusal.slice(0, 160)}` : ''};` +
        ` bound on the first answer: ${boundMs} ms (cluster-node-timeout + 3 s)`,
    );
    await redisCluster.restart(victim);
    await redisCluster.waitHealthy();
    return {
      conversations: ids.length,
      affected: affected.size,
      acknowledged: acked.length,
      unanswered,
      refused,
      firstRefusal,
      firstAnswerAffected: affectedFirst,
      firstAnswerOthers: othersFirst,
      boundMs,
      withinBound: firstOf([...affected]).filter((ms) => ms <= boundMs).length,
    };
  } finally {
    await mapLimit(ids, 20, (id) =>
      stopConversation(gateways[0].url, token, id).catch(() => undefined),
    );
  }
}
