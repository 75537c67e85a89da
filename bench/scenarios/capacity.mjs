// Capacity: what each role (gateways, workers, Postgres, Redis) spends per
// unit of work, the numbers docs/capacity.md turns into nodes. On one Redis
// (a private redis-server, so that its counters are this run's only) and on a
// local 3-master Redis Cluster with CONVERSATION_QUEUES=8, each beside the
// run's own cluster with the same gateways and workers:
// - memory per idle socket (a gateway) and per hosted idle conversation (the
//   workers), and what hosted idle conversations cost in CPU and Postgres
//   transactions (bench/scenarios/memory.mjs, on fresh processes);
// - per user message with its answer, at three paced rates: CPU of each role
//   (from /proc: the services, this database's Postgres backends, the Redis
//   servers), Redis commands (INFO commandstats of the masters) and Postgres
//   transactions (pg_stat_database, which lags by up to a second);
// - per streamed delta (bench_pacer streams at 50 deltas/s each): the same.
// A rate's CPU includes the background work (leases, polls): the slope over
// the three rates is the cost of one more message, the rest is the base.
import {
  ConversationSocket,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { startCpuMeter } from '../lib/proc.mjs';
import { commandCallsAt, redisClusterAvailable, startRedisCluster } from '../lib/redis-cluster.mjs';
import { withSideCluster } from '../lib/side-cluster.mjs';
import { round, summarize } from '../lib/stats.mjs';
import { redisServer } from '../../chaos/processes.mjs';
import { gatewaySockets, transactions, workerConversations } from './memory.mjs';
import { CLUSTER_QUEUES } from './redis-cluster.mjs';
import { PACER_AGENT } from './streaming.mjs';
import { closeConversations, drive, openConversations } from './sustained.mjs';

const ROLES = ['gateway', 'worker', 'postgres', 'redis'];
const READY_TIMEOUT_MS = 60_000;
const STREAM_RATE = 50;

/** CPU ms each role spent in a meter's window (its processes' shares, summed). */
function roleMs(cpu) {
  const result = {};
  for (const role of ROLES) {
    const percent = Object.entries(cpu.processes)
      .filter(([name]) => name.startsWith(role))
      .reduce((sum, [, value]) => sum + (value ?? 0), 0);
    result[role] = (percent / 100) * cpu.seconds * 1000;
  }
  return result;
}

const perUnit = (ms, units) =>
  Object.fromEntries(
    Object.entries(ms).map(([role, v]) => [role, units > 0 ? round(v / units) : null]),
  );

function commandDelta(before, after) {
  const delta = {};
  for (const [command, calls] of Object.entries(after)) {
    const n = calls - (before[command] ?? 0);
    if (n > 0) delta[command] = n;
  }
  return delta;
}

function commandsPer(delta, units) {
  const total = Object.values(delta).reduce((a, b) => a + b, 0);
  const top = Object.entries(delta)
    .sort((a, b) => b[1] - a[1])
    .slice(0, 8)
    .map(([command, n]) => `${command} ${round(n / units)}`);
  return { total: units > 0 ? round(total / units) : null, top };
}

/** Counters read when a measured window opens and closes. */
function windowCounters(side, redis) {
  return {
    open: async () => ({ calls: await redis.commandCalls(), tx: await transactions(side.cluster) }),
    close: async (opened) => ({
      calls: commandDelta(opened.calls, await redis.commandCalls()),
      tx: (await transactions(side.cluster)) - opened.tx,
    }),
  };
}

/** Least-squares slope and intercept of y over x. */
function fit(xs, ys) {
  const n = xs.length;
  if (n < 2) return null;
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) ** 2;
  }
  if (sxx === 0) return null;
  const slope = sxy / sxx;
  return { slope, intercept: my - slope * mx };
}

async function messageCost(side, redis, rates, conversations, durationMs) {
  const { log } = side;
  const clients = [];
  const levels = [];
  try {
    const failed = await openConversations(side, clients, 0, conversations);
    if (failed > 0) log(`    ${failed} conversations failed to open`);
    const ready = clients.filter((c) => c.readyAt !== null && c.socket.connected);
    for (const rate of rates) {
      const run = await drive(side, ready, durationMs, rate, windowCounters(side, redis));
      const ms = roleMs(run.cpu);
      const answered = run.answered;
      const level = {
        offeredRate: rate,
        answeredPerSecond: round(answered / run.windowS),
        latency: summarize(run.samples),
        errors: run.errors,
        cpuPercent: Object.fromEntries(
          Object.entries(ms).map(([role, v]) => [role, round((v / (run.windowS * 1000)) * 100)]),
        ),
        cpuMsPerMessage: perUnit(ms, answered),
        redisCommandsPerMessage: commandsPer(run.measured.calls, answered),
        redisCommandsPerSecond: round(
          Object.values(run.measured.calls).reduce((a, b) => a + b, 0) / run.windowS,
        ),
        pgTransactionsPerMessage: answered > 0 ? round(run.measured.tx / answered) : null,
        machinePercent: run.cpu.machine,
        loadAverage: run.cpu.loadAverage,
      };
      levels.push(level);
      log(
        `    ${rate} msg/s offered over ${ready.length} conversations: ${level.answeredPerSecond} answered/s,` +
          ` p50 ${level.latency.p50} ms p99 ${level.latency.p99} ms, errors ${run.errors};` +
          ` CPU ms per message: ${ROLES.map((r) => `${r} ${level.cpuMsPerMessage[r]}`).join(', ')};` +
          ` Redis commands per message ${level.redisCommandsPerMessage.total}` +
          ` (${level.redisCommandsPerMessage.top.join(', ')}); Postgres transactions per message` +
          ` ${level.pgTransactionsPerMessage}; machine ${run.cpu.machine}% (load ${run.cpu.loadAverage.join(' → ')})`,
      );
    }
  } finally {
    await closeConversations(clients);
  }
  // The cost of one more message per second: the slope of each role's CPU over the answered rates.
  const marginal = {};
  for (const role of ROLES) {
    const line = fit(
      levels.map((l) => l.answeredPerSecond),
      levels.map((l) => l.cpuPercent[role]),
    );
    marginal[role] = line
      ? { msPerMessage: round(line.slope * 10), basePercent: round(line.intercept) }
      : null;
  }
  const commands = fit(
    levels.map((l) => l.answeredPerSecond),
    levels.map((l) => l.redisCommandsPerSecond),
  );
  marginal.redisCommands = commands
    ? { perMessage: round(commands.slope), basePerSecond: round(commands.intercept) }
    : null;
  log(
    `    marginal CPU ms per message (slope over the rates; base % of a core at no messages):` +
      ` ${ROLES.map((r) => `${r} ${marginal[r]?.msPerMessage} (base ${marginal[r]?.basePercent}%)`).join(', ')};` +
      ` Redis commands per message ${marginal.redisCommands?.perMessage} (base ${marginal.redisCommands?.basePerSecond}/s)`,
  );
  return { levels, marginal };
}

async function deltaCost(side, redis, streams, durationMs) {
  const { cluster, log } = side;
  const gateways = cluster.gateways;
  const token = await side.token('capacity-streams');
  const clients = [];
  let deltas = 0;
  try {
    await mapLimit(
      Array.from({ length: streams }, (_, i) => i),
      10,
      async (i) => {
        const gateway = gateways[i % gateways.length];
        const id = await createConversation(gateway.url, token, {
          title: `capacity stream ${i}`,
          agent: PACER_AGENT,
          agent_config: { rate: STREAM_RATE, count: 10 },
        });
        const client = new ConversationSocket(gateway.url, token, id);
        client.stopWith = gateway.url;
        clients.push(client);
        await client.connected;
        await client.ready(READY_TIMEOUT_MS);
        client.socket.on('oh_event', (event) => {
          if (event?.stream !== true || typeof event.delta !== 'string') return;
          for (const piece of event.delta.split(' ')) if (piece !== '') deltas += 1;
        });
      },
    );
    const count = Math.ceil((STREAM_RATE * (durationMs + 3000)) / 1000);
    const turns = clients.map((client) =>
      client
        .roundTrip(JSON.stringify({ rate: STREAM_RATE, count }), durationMs + 60_000)
        .catch(() => undefined),
    );
    await sleep(1000);
    const counters = windowCounters(side, redis);
    const opened = await counters.open();
    const meter = startCpuMeter(() => cluster.meterTargets());
    const from = deltas;
    await sleep(durationMs);
    const cpu = meter.stop();
    const received = deltas - from;
    const closed = await counters.close(opened);
    await Promise.all(turns);
    const ms = roleMs(cpu);
    const result = {
      streams: clients.length,
      deltasPerSecond: round(received / cpu.seconds),
      cpuMsPerDelta: perUnit(ms, received),
      redisCommandsPerDelta: commandsPer(closed.calls, received),
      pgTransactionsPerDelta: received > 0 ? round(closed.tx / received) : null,
      machinePercent: cpu.machine,
    };
    log(
      `    ${clients.length} streams × ${STREAM_RATE} deltas/s: ${result.deltasPerSecond} deltas/s received;` +
        ` CPU ms per delta: ${ROLES.map((r) => `${r} ${result.cpuMsPerDelta[r]}`).join(', ')};` +
        ` Redis commands per delta ${result.redisCommandsPerDelta.total}` +
        ` (${result.redisCommandsPerDelta.top.join(', ')}); machine ${cpu.machine}%`,
    );
    return result;
  } finally {
    for (const client of clients) client.close();
    await mapLimit(clients, 20, (client) =>
      stopConversation(client.stopWith, token, client.conversationId).catch(() => undefined),
    );
  }
}

async function measureBackend(side, redis) {
  const { options, log } = side;
  const quick = options.quick;
  log('    memory (fresh processes):');
  const sockets = await gatewaySockets(side, side.cluster.gateways[0], {
    count: Math.min(options.memorySockets, quick ? 500 : 2000),
    idleWindowMs: quick ? 2000 : 5000,
  });
  const hosted = await workerConversations(side, {
    count: Math.min(options.memoryConversations, quick ? 200 : 1000),
    idleWindowMs: quick ? 4000 : 10_000,
  });
  log('    per user message with its answer:');
  const messages = await messageCost(
    side,
    redis,
    options.capacityRates,
    quick ? Math.min(60, options.capacityConversations) : options.capacityConversations,
    (quick ? 5 : 10) * 1000,
  );
  log('    per streamed delta:');
  const streaming = await deltaCost(side, redis, quick ? 10 : 20, (quick ? 4 : 8) * 1000);
  return { memory: { gateway: sockets, worker: hosted }, messages, streaming };
}

export async function runCapacity(ctx) {
  const { log } = ctx;
  if (!redisClusterAvailable()) throw new Error('needs redis-server and redis-cli (Debian redis)');
  const result = {};
  log('  one Redis (a private redis-server):');
  const single = await redisServer(undefined, { durable: false });
  try {
    const redis = { commandCalls: () => commandCallsAt(single.port) };
    result.redis = await withSideCluster(
      ctx,
      { redis: { url: single.url, pid: single.pid } },
      (side) => measureBackend(side, redis),
    );
  } finally {
    await single.kill('SIGKILL');
    single.cleanup();
  }
  log(`  Redis Cluster (3 masters + 3 replicas, CONVERSATION_QUEUES=${CLUSTER_QUEUES}):`);
  const redisCluster = await startRedisCluster();
  try {
    result.redisCluster = await withSideCluster(
      ctx,
      { redisCluster, conversationQueues: CLUSTER_QUEUES },
      (side) => measureBackend(side, redisCluster),
    );
  } finally {
    await redisCluster.stop();
  }
  return result;
}
