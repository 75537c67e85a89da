// Sustained load: many conversations spread over the gateways, each client
// sending a message, waiting for the echo and sending again for a fixed time.
// Load levels go up (e.g. 10, 100, 1000 clients); each level adds the
// conversations it needs, so a level hosts only its own conversations.
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
async function openConversations(ctx, clients, from, to) {
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

/**
 * Every client loops (send, wait for the echo) until `durationMs` is over.
 * The first part of the time is a warm-up; in the measured window, latency
 * counts messages sent in it, throughput the answers that arrived in it.
 */
async function drive(ctx, clients, durationMs) {
  const { cluster } = ctx;
  const warmupMs = Math.min(3000, durationMs * 0.2);
  const started = performance.now();
  const measureFrom = started + warmupMs;
  const end = started + durationMs;
  const samples = [];
  const trips = [];
  let answeredInWindow = 0;
  let errors = 0;
  let firstError = null;
  const windowOpened = sleep(warmupMs).then(async () => ({
    meter: startCpuMeter(() => cluster.meterTargets()),
    snapshot: await serviceSnapshot(cluster),
    activity: startActivitySampler(cluster),
  }));
  const windowClosed = windowOpened.then(async (opened) => {
    await sleep(Math.max(0, end - performance.now()));
    const cpu = opened.meter.stop();
    return {
      cpu,
      before: opened.snapshot,
      after: await serviceSnapshot(cluster),
      postgres: await opened.activity.stop(),
    };
  });
  await Promise.all(
    clients.map(async (client, c) => {
      for (let i = 0; performance.now() < end; i += 1) {
        const sentAt = performance.now();
        try {
          const trip = await client.roundTrip(`load ${c}.${i}`, MESSAGE_TIMEOUT_MS);
          const doneAt = sentAt + trip.total;
          if (doneAt >= measureFrom && doneAt <= end) answeredInWindow += 1;
          if (sentAt >= measureFrom) {
            samples.push(trip.total);
            trips.push({ ...trip, conversationId: client.conversationId });
          }
        } catch (error) {
          errors += 1;
          firstError ??= String(error);
        }
      }
    }),
  );
  const window = await windowClosed;
  const windowS = (end - measureFrom) / 1000;
  return {
    samples,
    trips,
    throughput: round(answeredInWindow / windowS),
    appends: appendsPerMessage(window.before, window.after, answeredInWindow),
    eventLoop: window.after.eventLoop,
    postgres: window.postgres,
    errors,
    firstError,
    cpu: window.cpu,
  };
}

export async function runSustained(ctx) {
  const { options, log } = ctx;
  const top = options.quick
    ? Math.min(100, options.sustainedConversations)
    : options.sustainedConversations;
  const durationS = options.quick ? 5 : options.durationS;
  const levels = [...new Set([...options.sustainedLevels.filter((l) => l < top), top])].sort(
    (a, b) => a - b,
  );
  const clients = [];
  const results = [];
  try {
    for (const level of levels) {
      const openStarted = performance.now();
      const failedToOpen = await openConversations(ctx, clients, clients.length, level);
      const openS = round((performance.now() - openStarted) / 1000);
      const ready = clients.filter((c) => c.readyAt !== null && c.socket.connected);
      const run = await drive(ctx, ready.slice(0, level), durationS * 1000);
      const latency = summarize(run.samples);
      const throughput = run.throughput;
      const benchCpu = run.cpu?.bench ?? null;
      log(
        `  ${String(level).padStart(5)} client${level === 1 ? ' ' : 's'}: ${String(throughput).padStart(7)} msg/s  ${formatSummary(latency)}` +
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
    for (const client of clients) client.close();
    await mapLimit(clients, 20, (client) =>
      stopConversation(client.stopWith.url, client.stopWith.token, client.conversationId).catch(
        () => undefined,
      ),
    );
  }
  const last = results[results.length - 1];
  return {
    durationS,
    levels: results,
    latency: last?.latency ?? null,
    throughput: last?.throughput ?? null,
    cpu: last?.cpu ?? null,
  };
}
