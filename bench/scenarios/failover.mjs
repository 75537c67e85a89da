// Failover (kill -9) and hand-off (SIGTERM) of a worker: N running
// conversations without any client, all held by one worker; the worker is
// stopped, a message is sent to each conversation through REST right after,
// and the time until each answer is stored is read from Postgres (the
// event's own timestamp), so that no client connection changes the outcome.
import { createConversation, mapLimit, postMessage, stopConversation } from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { formatEventLoop, serviceSnapshot } from '../lib/metrics.mjs';

const SETTLE_TIMEOUT_MS = 60_000;
const HANDOFF_BOUND_MS = 2_000;
const POLL_MS = 50;

const ANSWERS_SQL = `
  SELECT e.conversation_id::text AS id, (extract(epoch FROM e.created_at) * 1000)::float8 AS at
    FROM unnest($1::uuid[], $2::bigint[]) AS t(cid, uid)
    JOIN events e ON e.conversation_id = t.cid AND e.cause = t.uid
   WHERE e.source = 'agent' AND e.type = 'message'`;

// The new holder's first write is its session's `loading` state change.
const TAKEOVERS_SQL = `
  SELECT conversation_id::text AS id, (extract(epoch FROM min(created_at)) * 1000)::float8 AS at
    FROM events
   WHERE conversation_id = ANY($1::uuid[]) AND type = 'agent_state_changed'
     AND payload->'extras'->>'agent_state' = 'loading'
     AND created_at >= to_timestamp($2::float8 / 1000)
   GROUP BY conversation_id`;

/** Conversations of the pool that are running and idle (answered, awaiting input). */
export async function settledCount(cluster, ids) {
  const { rows } = await cluster.db.query(
    `SELECT count(*)::int AS n FROM conversations
      WHERE id = ANY($1::uuid[]) AND status = 'RUNNING' AND agent_state = 'awaiting_user_input'`,
    [ids],
  );
  return rows[0].n;
}

/**
 * Grows the pool of running conversations (each started with a first message)
 * until one worker holds at least `n` of them; returns that worker and `n` ids.
 */
async function gatherOnOneWorker(ctx, pool, n) {
  const { cluster, log } = ctx;
  const token = await ctx.token('failover');
  const limit = 4 * n + 50;
  for (let round = 0; round < 8; round += 1) {
    const holdings = await cluster.holdings();
    let best = null;
    let bestIds = [];
    for (const [worker, held] of holdings) {
      const ids = pool.filter((id) => held.has(id));
      if (ids.length > bestIds.length) {
        best = worker;
        bestIds = ids;
      }
    }
    if (best && bestIds.length >= n) return { victim: best, ids: bestIds.slice(0, n), token };
    if (pool.length >= limit) break;
    const missing = Math.min(limit - pool.length, (n - bestIds.length) * cluster.workers.length);
    const gateways = cluster.gateways;
    const created = await mapLimit(
      Array.from({ length: missing }, (_, i) => i),
      16,
      (i) =>
        createConversation(gateways[i % gateways.length].url, token, {
          title: `failover pool ${pool.length + i}`,
          initial_user_msg: 'hello',
        }),
    );
    pool.push(...created);
    const deadline = Date.now() + SETTLE_TIMEOUT_MS;
    while (Date.now() < deadline && (await settledCount(cluster, pool)) < pool.length) {
      await sleep(200);
    }
    log(`  pool: ${pool.length} running conversations`);
  }
  throw new Error(`no worker holds ${n} conversations of a pool of ${pool.length}`);
}

/** Polls Postgres for the answers; returns conversation id → answer time (epoch ms). */
async function waitForAnswers(cluster, sent, deadline) {
  const answered = new Map();
  while (answered.size < sent.length && Date.now() < deadline) {
    const pending = sent.filter((s) => !answered.has(s.id));
    const { rows } = await cluster.db.query(ANSWERS_SQL, [
      pending.map((s) => s.id),
      pending.map((s) => s.eventId),
    ]);
    for (const row of rows) if (!answered.has(row.id)) answered.set(row.id, row.at);
    if (answered.size < sent.length) await sleep(POLL_MS);
  }
  return answered;
}

/** `signal` SIGKILL: failover; SIGTERM: hand-off. */
export async function runFailover(ctx, signal) {
  const { cluster, options, log } = ctx;
  if (cluster.workers.length < 2) throw new Error('needs at least two workers (--workers 2)');
  const n = options.quick
    ? Math.min(20, options.failoverConversations)
    : options.failoverConversations;
  ctx.failoverPool ??= [];
  const pool = ctx.failoverPool;
  const { victim, ids, token } = await gatherOnOneWorker(ctx, pool, n);
  // Only the measured conversations stay on the worker to be stopped.
  const selected = new Set(ids);
  const extra = [...((await cluster.holdings()).get(victim) ?? [])].filter(
    (id) => !selected.has(id) && pool.includes(id),
  );
  await mapLimit(extra, 20, (id) =>
    stopConversation(cluster.gateways[0].url, token, id).catch(() => undefined),
  );
  for (const id of extra) pool.splice(pool.indexOf(id), 1);
  let heldByVictim = 0;
  for (const deadline = Date.now() + 15_000; Date.now() < deadline; await sleep(200)) {
    heldByVictim = (await cluster.holdings()).get(victim)?.size ?? 0;
    if (heldByVictim <= ids.length) break;
  }
  log(`  ${victim.name} holds ${heldByVictim} conversations; measuring ${ids.length} of them`);
  await sleep(300);

  const gateways = cluster.gateways;
  await serviceSnapshot(cluster); // resets the event-loop histograms
  const meter = startCpuMeter(() => cluster.meterTargets());
  const stoppedAt = Date.now();
  const stoppedPerf = performance.now();
  const stopping = cluster.stopWorker(victim, signal);
  const sent = await mapLimit(ids, 50, async (id, i) => {
    const sendStarted = Date.now();
    const url = gateways[i % gateways.length].url;
    const eventId = await postMessage(url, token, id, `after ${signal} ${i}`);
    const sentAt = Date.now();
    return { id, eventId, sentAt, sendMs: sentAt - sendStarted };
  });
  const sentWithinMs = Math.max(...sent.map((s) => s.sentAt)) - stoppedAt;
  const bound = signal === 'SIGKILL' ? options.leaseTtlMs + 2000 : HANDOFF_BOUND_MS;
  const answers = await waitForAnswers(cluster, sent, stoppedAt + bound + 20_000);
  const cpu = meter.stop();
  const { eventLoop } = await serviceSnapshot(cluster);
  const exit = await stopping;
  const exitMs = exit ? Math.round(exit.at - stoppedPerf) : null;
  const { rows } = await cluster.db.query(TAKEOVERS_SQL, [ids, stoppedAt]);
  const takenOverAt = new Map(rows.map((row) => [row.id, row.at]));

  const fromStop = [];
  const fromSend = [];
  const takeovers = [];
  const takeoverToAnswer = [];
  for (const s of sent) {
    const at = answers.get(s.id);
    const takenAt = takenOverAt.get(s.id);
    if (takenAt !== undefined) takeovers.push(takenAt - stoppedAt);
    if (at === undefined) continue;
    fromStop.push(at - stoppedAt);
    fromSend.push(at - s.sentAt);
    if (takenAt !== undefined) takeoverToAnswer.push(at - Math.max(takenAt, s.sentAt));
  }
  const latency = summarize(fromStop);
  const afterSend = summarize(fromSend);
  const send = summarize(sent.map((s) => s.sendMs));
  const takeover = summarize(takeovers);
  const restoreAndAnswer = summarize(takeoverToAnswer);
  const measured = signal === 'SIGKILL' ? fromStop : fromSend;
  const withinBound = measured.filter((ms) => ms <= bound).length;
  log(`  ${signal} → answer stored          ${formatSummary(latency)}`);
  log(`  message sent → answer stored   ${formatSummary(afterSend)}`);
  log(`  ${signal} → new holder's loading   ${formatSummary(takeover)}`);
  log(`  loading (or send) → answer     ${formatSummary(restoreAndAnswer)}`);
  log(`  REST send of the message       ${formatSummary(send)}`);
  log(`  until the last answer: ${formatCpu(cpu)}`);
  log(`  ${formatEventLoop(eventLoop)}`);
  log(
    `  ${answers.size}/${sent.length} answered; ${withinBound} within ${bound} ms` +
      ` (${signal === 'SIGKILL' ? 'LEASE_TTL_MS + 2 s, from the kill' : '2 s, from the send'});` +
      ` messages sent within ${sentWithinMs} ms of the signal; ${victim.name} exited after ${exitMs} ms`,
  );

  const restartStarted = performance.now();
  const replacement = await cluster.startWorker();
  const restartMs = round(performance.now() - restartStarted);
  log(`  started ${replacement.name} in ${Math.round(restartMs)} ms`);

  if (!ctx.upcoming.includes('handoff') && !ctx.upcoming.includes('failover')) {
    await mapLimit(pool, 20, (id) =>
      stopConversation(gateways[0].url, token, id).catch(() => undefined),
    );
    pool.length = 0;
  }
  return {
    signal,
    conversations: sent.length,
    heldByVictim,
    latency,
    afterSend,
    takeover,
    restoreAndAnswer,
    send,
    cpu,
    eventLoop,
    max: latency.max,
    boundMs: bound,
    withinBound,
    unanswered: sent.length - answers.size,
    sentWithinMs,
    workerExitMs: exitMs,
    restartMs,
  };
}
