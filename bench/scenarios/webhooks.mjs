// Webhook delivery lag: conversations of their own tenant (the only one the
// bench's endpoint takes) each send a message through REST at their share
// of an offered rate; the echo agent answers; the receiver measures, for
// each turn.completed, the time from the answer being stored (the body's
// timestamp) to the request arriving. Paced levels, e.g. 100, 250 and 500
// turns/s over 1,000 conversations (docs/protocol.md "Webhooks"; the issue's
// target: p50 ≤ 20 ms and p99 ≤ 200 ms at 500 turns/s). Then the outbox's
// cost: as many conversations of a tenant no endpoint takes, paced at one of
// those rates (250 turns/s by default), and the services' CPU (gateways,
// workers, Postgres, Redis) with webhooks on against off at that rate, in
// alternating pairs (the issue's target: at most 10 % more per message).
import { devToken, mapLimit, postMessage, createConversation } from '../lib/client.mjs';
import { cpuByRole, formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';

/** The tenant of the bench's webhook endpoint (`tenants` in its WEBHOOKS entry). */
export const WEBHOOK_TENANT = 'bench-webhooks';
/** A tenant no endpoint takes: its turns enqueue nothing. */
const UNHOOKED_TENANT = 'bench-webhooks-off';
/** The processes of the service, whose CPU the outbox adds to. */
const SERVICE_ROLES = ['gateways', 'workers', 'postgres', 'redis'];
const USERS = 10;
const SETTLE_MS = 3_000;
/** Alternating on/off pairs of the outbox's cost (one with --quick). */
const OUTBOX_COST_PAIRS = 3;

/** Reads `cs_webhook_pending` from a worker's metrics. */
async function pending(cluster) {
  const worker = cluster.workers[0];
  if (!worker) return null;
  const text = await (await fetch(`${worker.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('cs_webhook_pending'));
  return line ? Number(line.split(' ').pop()) : null;
}

export async function runWebhooks(ctx) {
  const { cluster, options, log } = ctx;
  const receiver = ctx.webhookReceiver;
  if (!receiver) throw new Error('the webhook receiver was not started');
  const count = options.quick
    ? Math.min(100, options.webhookConversations)
    : options.webhookConversations;
  const rates = options.quick ? options.webhookRates.slice(0, 1) : options.webhookRates;
  const durationS = options.quick ? 5 : options.durationS;
  const conversations = await openConversations(ctx, WEBHOOK_TENANT, count);
  const before = receiver.turns.length;
  await warmUp(conversations);
  const deadline = performance.now() + 60_000;
  while (receiver.turns.length - before < count && performance.now() < deadline) await sleep(100);
  log(
    `  ${count} conversations answered once (${receiver.turns.length - before} turn.completed received)`,
  );

  const levels = [];
  for (const rate of rates) {
    const { sent, errors, firstError, cpu, windowFrom, windowTo } = await paceLevel(
      ctx,
      conversations,
      rate,
      durationS,
    );
    // The last answers of the level arrive a little after its end.
    await sleep(SETTLE_MS);
    const inWindow = receiver.turns.filter(([at]) => at >= windowFrom && at <= windowTo);
    const lag = summarize(inWindow.map(([, ms]) => ms));
    const throughput = round(inWindow.length / ((windowTo - windowFrom) / 1000));
    const left = await pending(cluster);
    log(
      `  ${rate} turns/s offered over ${count} conversations: ${throughput} turn.completed/s received` +
        `  lag ${formatSummary(lag)}  errors ${errors}  pending after ${SETTLE_MS / 1000} s: ${left}`,
    );
    log(`    ${formatCpu(cpu)}`);
    if (firstError) log(`    first error: ${firstError}`);
    levels.push({
      offeredRate: rate,
      conversations: count,
      sent,
      throughput: { value: throughput, unit: 'turn.completed/s' },
      lag,
      errors,
      firstError,
      pendingAfter: left,
      cpu,
    });
  }
  log(
    `  receiver: ${receiver.requests} requests, ${receiver.repeats} repeats (deduped), ` +
      `${receiver.badSignatures} bad signatures among those verified`,
  );
  const outboxCost = await measureOutboxCost(ctx, levels, conversations, count, durationS);
  // The headline: the level closest to 500 turns/s.
  const headline = [...levels].sort(
    (a, b) => Math.abs(a.offeredRate - 500) - Math.abs(b.offeredRate - 500),
  )[0];
  return {
    durationS,
    levels,
    latency: headline?.lag ?? null,
    throughput: headline?.throughput ?? null,
    badSignatures: receiver.badSignatures,
    outboxCost,
  };
}

/**
 * The outbox's cost: the same load, paced at one of the levels' rates, on
 * the webhook tenant's conversations (on) and on as many of a tenant no
 * endpoint takes (off), in alternating pairs (on, off; off, on; …) so that
 * a drift of the machine over the run (autovacuum, a neighbour, caches
 * warming) weighs on both sides alike; the services' CPU per turn is the
 * median of each side. One pair of one level each swung by ±10 % between
 * runs on this machine, more than the cost it was to show.
 */
async function measureOutboxCost(ctx, levels, hookedConversations, count, durationS) {
  const { options, log } = ctx;
  // The level at --webhook-cpu-rate, or the first (--quick runs one).
  const level = levels.find((l) => l.offeredRate === options.webhookCpuRate) ?? levels[0];
  if (!level) return null;
  const rate = level.offeredRate;
  const pairs = options.quick ? 1 : OUTBOX_COST_PAIRS;
  const unhooked = await openConversations(ctx, UNHOOKED_TENANT, count);
  await warmUp(unhooked);
  const serviceCpu = (cpu) => sumOf(cpuByRole(cpu), SERVICE_ROLES);
  // % of a core at `rate` turns/s → ms of CPU per turn.
  const perTurnMs = (cpu) => round((serviceCpu(cpu) * 10) / rate);
  const on = [];
  const off = [];
  // Each role's ms of CPU per turn, on and off: where the outbox's cost goes.
  const roles = Object.fromEntries(SERVICE_ROLES.map((role) => [role, { on: [], off: [] }]));
  let errors = 0;
  let lastOff = null;
  for (let pair = 0; pair < pairs; pair += 1) {
    const sides = pair % 2 === 0 ? ['on', 'off'] : ['off', 'on'];
    for (const side of sides) {
      const measured = await paceLevel(
        ctx,
        side === 'on' ? hookedConversations : unhooked,
        rate,
        durationS,
      );
      errors += measured.errors;
      (side === 'on' ? on : off).push(perTurnMs(measured.cpu));
      const shares = cpuByRole(measured.cpu);
      for (const role of SERVICE_ROLES) roles[role][side].push(round((shares[role] * 10) / rate));
      if (side === 'off') lastOff = measured.cpu;
    }
    log(`    pair ${pair + 1}: ${on.at(-1)} ms a turn on, ${off.at(-1)} ms off`);
  }
  const onMs = median(on);
  const offMs = median(off);
  const addedPercent = offMs > 0 ? round(((onMs - offMs) / offMs) * 100) : null;
  log(
    `  the outbox's cost at ${rate} turns/s: the services' CPU ${onMs} ms a turn with webhooks on,` +
      ` ${offMs} ms off, medians of ${pairs} alternating pair(s)` +
      ` (${addedPercent === null ? '?' : `${addedPercent > 0 ? '+' : ''}${addedPercent} %`})` +
      `  errors ${errors}`,
  );
  const addedByRole = Object.fromEntries(
    SERVICE_ROLES.map((role) => [role, round(median(roles[role].on) - median(roles[role].off))]),
  );
  log(
    `    added a turn, by role (medians): ${SERVICE_ROLES.map(
      (role) => `${role} ${addedByRole[role] > 0 ? '+' : ''}${addedByRole[role]} ms`,
    ).join(', ')}`,
  );
  if (lastOff) log(`    off, last: ${formatCpu(lastOff)}`);
  return {
    offeredRate: rate,
    conversations: count,
    pairs,
    onMsPerTurnEach: on,
    offMsPerTurnEach: off,
    onMsPerTurn: onMs,
    offMsPerTurn: offMs,
    addedPercent,
    addedMsPerTurnByRole: addedByRole,
    errors,
    cpuOff: lastOff,
  };
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1
    ? sorted[middle]
    : round((sorted[middle - 1] + sorted[middle]) / 2);
}

function sumOf(shares, roles) {
  return roles.reduce((total, role) => total + (shares[role] ?? 0), 0);
}

/** `count` conversations of `tenant`, spread over the gateways and over its users. */
async function openConversations(ctx, tenant, count) {
  const { cluster, log } = ctx;
  const gateways = cluster.gateways;
  const tokens = await Promise.all(
    Array.from({ length: USERS }, (_, u) => devToken(gateways[0].url, `hooked-${u}`, tenant)),
  );
  const opened = performance.now();
  const conversations = [];
  await mapLimit(
    Array.from({ length: count }, (_, i) => i),
    16,
    async (i) => {
      const gateway = gateways[i % gateways.length];
      const token = tokens[i % USERS];
      const id = await createConversation(gateway.url, token, { title: `${tenant} ${i}` });
      conversations.push({ id, url: gateway.url, token });
    },
  );
  log(
    `  ${count} conversations of ${tenant} opened in ${round((performance.now() - opened) / 1000)} s`,
  );
  return conversations;
}

/** A first message each starts the agents (a cold start is not what is measured). */
async function warmUp(conversations) {
  await mapLimit(conversations, 16, (conversation) =>
    postMessage(conversation.url, conversation.token, conversation.id, 'warm up'),
  );
}

/**
 * Each conversation sends through REST at its share of `rate`, out of phase,
 * for `durationS`; the CPU is measured after a warm-up, over the window
 * `windowFrom`..`windowTo` (wall-clock ms).
 */
async function paceLevel(ctx, conversations, rate, durationS) {
  const { cluster } = ctx;
  const periodMs = (conversations.length / rate) * 1000;
  const started = performance.now();
  const warmupMs = Math.min(3000, durationS * 200);
  const end = started + durationS * 1000;
  const windowFrom = Date.now() + warmupMs;
  const windowTo = Date.now() + durationS * 1000;
  let sent = 0;
  let errors = 0;
  let firstError = null;
  const meter = sleep(warmupMs).then(() => startCpuMeter(() => cluster.meterTargets()));
  await Promise.all(
    conversations.map(async (conversation, c) => {
      let due = started + Math.random() * periodMs;
      for (let i = 0; ; i += 1) {
        await sleep(Math.max(0, due - performance.now()));
        if (performance.now() >= end) break;
        due += periodMs;
        try {
          await postMessage(
            conversation.url,
            conversation.token,
            conversation.id,
            `hook ${c}.${i}`,
          );
          sent += 1;
        } catch (error) {
          errors += 1;
          firstError ??= String(error);
        }
      }
    }),
  );
  const cpu = (await meter).stop();
  return { sent, errors, firstError, cpu, windowFrom, windowTo };
}
