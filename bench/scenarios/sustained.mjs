// Sustained load: many conversations spread over the gateways, each client
// sending a message, waiting for the echo and sending again for a fixed time.
// Closed-loop levels go up (e.g. 1, 10, 100, 1000 clients, each sending again
// as soon as its echo arrives: the most the cluster answers); each level adds
// the conversations it needs. Then paced levels: all the conversations, each
// sending at its share of an offered rate (e.g. 1,000 msg/s over 1,000
// conversations: one message a second each), the way users type; latency is
// counted from when a message was due, so a slow answer that delays the next
// message counts against the service (no coordinated omission).
import {
  ConversationSocket,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { formatBreakdown, roundTripBreakdown } from '../lib/breakdown.mjs';
import {
  appendsPerMessage,
  formatAppends,
  formatEventLoop,
  serviceSnapshot,
} from '../lib/metrics.mjs';
import { formatActivity, startActivitySampler } from '../lib/pg-activity.mjs';

const USERS = 10;
const READY_TIMEOUT_MS = 60_000;
const MESSAGE_TIMEOUT_MS = 15_000;

/**
 * Opens conversations `from..to-1` (create, connect, wait until the agent is
 * ready) and adds them to `clients` as they open; returns how many failed.
 */
export async function openConversations(ctx, clients, from, to) {
  const { cluster, log } = ctx;
  const gateways = cluster.gateways;
  let failed = 0;
  await mapLimit(
    Array.from({ length: to - from }, (_, k) => from + k),
    16,
    async (i) => {
      try {
        const user = `sustained-${i % USERS}`;
        const token = await ctx.token(user);
        const gateway = gateways[i % gateways.length];
        const id = await createConversation(gateway.url, token, { title: `sustained ${i}` });
        const client = new ConversationSocket(gateway.url, token, id);
        client.stopWith = { url: gateway.url, token };
        clients.push(client);
        await client.connected;
        await client.ready(READY_TIMEOUT_MS);
      } catch (error) {
        failed += 1;
        if (failed <= 3) log(`    opening conversation ${i}: ${String(error)}`);
      }
    },
  );
  return failed;
}

/** Closes the sockets of conversations `openConversations` opened, and stops their agents. */
export async function closeConversations(clients) {
  for (const client of clients) client.close();
  await mapLimit(clients, 20, (client) =>
    stopConversation(client.stopWith.url, client.stopWith.token, client.conversationId).catch(
      () => undefined,
    ),
  );
}

/**
 * Every client loops (send, wait for the echo) until `durationMs` is over.
 * The first part of the time is a warm-up; in the measured window, latency
 * counts messages sent in it, throughput the answers that arrived in it.
 * `window`: more to read when the window opens (`open()`) and closes
 * (`close(opened)`, its result returned as `measured`), e.g. Redis counters;
 * `window.ends`, a promise: the window closes and the load stops when it
 * settles, if that comes before `durationMs` (e.g. once a sweep is done).
 */
export async function drive(ctx, clients, durationMs, rate = null, window = null) {
  const periodMs = rate === null ? null : (clients.length / rate) * 1000;
  const { cluster } = ctx;
  const warmupMs = Math.min(3000, durationMs * 0.2);
  const started = performance.now();
  const measureFrom = started + warmupMs;
  let end = started + durationMs;
  void window?.ends?.then(() => {
    end = Math.min(end, Math.max(measureFrom, performance.now()));
  });
  const samples = [];
  const trips = [];
  let answeredInWindow = 0;
  let errors = 0;
  let firstError = null;
  const windowOpened = sleep(warmupMs).then(async () => ({
    extra: await window?.open?.(),
    meter: startCpuMeter(() => cluster.meterTargets()),
    snapshot: await serviceSnapshot(cluster),
    activity: startActivitySampler(cluster),
  }));
  const windowClosed = windowOpened.then(async (opened) => {
    // In steps: `end` comes sooner when `window.ends` settles.
    while (performance.now() < end) await sleep(Math.min(250, end - performance.now()));
    const cpu = opened.meter.stop();
    return {
      measured: await window?.close?.(opened.extra),
      cpu,
      before: opened.snapshot,
      after: await serviceSnapshot(cluster),
      postgres: await opened.activity.stop(),
    };
  });
  await Promise.all(
    clients.map(async (client, c) => {
      // Paced: spread over the period so that the sends do not come in waves.
      let due = started + (periodMs === null ? 0 : Math.random() * periodMs);
      for (let i = 0; performance.now() < end; i += 1) {
        if (periodMs !== null) {
          await sleep(Math.max(0, due - performance.now()));
          if (performance.now() >= end) break;
        }
        const sentAt = performance.now();
        const countFrom = periodMs === null ? sentAt : Math.min(due, sentAt);
        if (periodMs !== null) due += periodMs;
        try {
          const trip = await client.roundTrip(`load ${c}.${i}`, MESSAGE_TIMEOUT_MS);
          const doneAt = sentAt + trip.total;
          if (doneAt >= measureFrom && doneAt <= end) answeredInWindow += 1;
          if (countFrom >= measureFrom) {
            samples.push(doneAt - countFrom);
            trips.push({ ...trip, conversationId: client.conversationId });
          }
        } catch (error) {
          errors += 1;
          firstError ??= String(error);
        }
      }
    }),
  );
  const closed = await windowClosed;
  const windowS = (end - measureFrom) / 1000;
  return {
    samples,
    trips,
    throughput: round(answeredInWindow / windowS),
    appends: appendsPerMessage(closed.before, closed.after, answeredInWindow),
    eventLoop: closed.after.eventLoop,
    postgres: closed.postgres,
    errors,
    firstError,
    cpu: closed.cpu,
    measured: closed.measured,
    answered: answeredInWindow,
    windowS,
  };
}

export async function runSustained(ctx) {
  const { options, log } = ctx;
  const top = options.quick
    ? Math.min(100, options.sustainedConversations)
    : options.sustainedConversations;
  const durationS = options.quick ? 5 : options.durationS;
  const closed = [...new Set([...options.sustainedLevels.filter((l) => l < top), top])]
    .sort((a, b) => a - b)
    .map((clients) => ({ clients, rate: null }));
  const rates = options.quick ? options.sustainedRates.slice(0, 2) : options.sustainedRates;
  const levels = [...closed, ...rates.map((rate) => ({ clients: top, rate }))];
  const clients = [];
  const results = [];
  try {
    for (const { clients: level, rate } of levels) {
      const openStarted = performance.now();
      const failedToOpen =
        clients.length < level ? await openConversations(ctx, clients, clients.length, level) : 0;
      const openS = round((performance.now() - openStarted) / 1000);
      const ready = clients.filter((c) => c.readyAt !== null && c.socket.connected);
      const run = await drive(ctx, ready.slice(0, level), durationS * 1000, rate);
      const latency = summarize(run.samples);
      const throughput = run.throughput;
      const benchCpu = run.cpu?.bench ?? null;
      const name =
        `${String(level).padStart(5)} client${level === 1 ? ' ' : 's'}` +
        (rate === null ? '' : ` at ${rate} msg/s`);
      log(
        `  ${name}: ${String(throughput).padStart(7)} msg/s  ${formatSummary(latency)}` +
          `  errors ${run.errors}  (opened in ${openS} s)`,
      );
      log(`    ${formatCpu(run.cpu)}`);
      log(`    ${formatAppends(run.appends)}`);
      log(`    ${formatEventLoop(run.eventLoop)}`);
      log(`    ${formatActivity(run.postgres)}`);
      const breakdown = await roundTripBreakdown(ctx.cluster, run.trips);
      for (const line of formatBreakdown(breakdown, '    ')) log(line);
      if (run.firstError) log(`    first error: ${run.firstError}`);
      if (benchCpu !== null && benchCpu > 85)
        log('    the load generator was close to one full core: latency includes its own queueing');
      results.push({
        clients: level,
        offeredRate: rate,
        throughput: { value: throughput, unit: 'msg/s' },
        latency,
        errors: run.errors,
        firstError: run.firstError,
        openS,
        failedToOpen,
        breakdown,
        appends: run.appends,
        eventLoop: run.eventLoop,
        postgres: run.postgres,
        cpu: run.cpu,
      });
    }
  } finally {
    await closeConversations(clients);
  }
  // The headline: the paced level at the offered rate closest to 1,000 msg/s, else the last.
  const paced = results.filter((r) => r.offeredRate !== null);
  const last =
    paced.sort((a, b) => Math.abs(a.offeredRate - 1000) - Math.abs(b.offeredRate - 1000))[0] ??
    results[results.length - 1];
  return {
    durationS,
    levels: results,
    latency: last?.latency ?? null,
    throughput: last?.throughput ?? null,
    cpu: last?.cpu ?? null,
  };
}
