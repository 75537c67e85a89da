// Webhook delivery lag: conversations of their own tenant (the only one the
// bench's endpoint takes) each send a message through REST at their share
// of an offered rate; the echo agent answers; the receiver measures, for
// each turn.completed, the time from the answer being stored (the body's
// timestamp) to the request arriving. Paced levels, e.g. 100, 250 and 500
// turns/s over 1,000 conversations (docs/protocol.md "Webhooks"; the issue's
// target: p50 ≤ 20 ms and p99 ≤ 200 ms at 500 turns/s). Then the outbox's
// cost: as many conversations of a tenant no endpoint takes, paced at one of
// those rates (250 turns/s by default), and the services' CPU (gateways,
// workers, Postgres, Redis) with webhooks on against off at that rate (the
// issue's target: at most 10 % more per message).
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
  const outboxCost = await measureOutboxCost(ctx, levels, count, durationS);
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
 * The same load, paced at the rate of one of the levels above, on
 * conversations of a tenant no endpoint takes: the services' CPU per turn with
 * webhooks on (that level) against off (this one).
 */
async function measureOutboxCost(ctx, levels, count, durationS) {
  const { options, log } = ctx;
  // The level at --webhook-cpu-rate, or the first (--quick runs one).
  const hooked = levels.find((level) => level.offeredRate === options.webhookCpuRate) ?? levels[0];
  if (!hooked) return null;
  const rate = hooked.offeredRate;
  const conversations = await openConversations(ctx, UNHOOKED_TENANT, count);
  await warmUp(conversations);
  const off = await paceLevel(ctx, conversations, rate, durationS);
  const serviceCpu = (cpu) => sumOf(cpuByRole(cpu), SERVICE_ROLES);
  // % of a core at `rate` turns/s → ms of CPU per turn.
  const perTurnMs = (cpu) => round((serviceCpu(cpu) * 10) / rate);
  const on = perTurnMs(hooked.cpu);
  const without = perTurnMs(off.cpu);
  const addedPercent = without > 0 ? round(((on - without) / without) * 100) : null;
  log(
    `  the outbox's cost at ${rate} turns/s: the services' CPU ${on} ms a turn with webhooks on,` +
      ` ${without} ms off (${addedPercent === null ? '?' : `${addedPercent > 0 ? '+' : ''}${addedPercent} %`})` +
      `  errors ${off.errors}`,
  );
  log(`    off: ${formatCpu(off.cpu)}`);
  return {
    offeredRate: rate,
    conversations: count,
    onMsPerTurn: on,
    offMsPerTurn: without,
    addedPercent,
    errors: off.errors,
    cpuOff: off.cpu,
  };
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
