// Streamed deltas, from the moment an agent emits one to the moment a client
// receives it: the bench's own agent module (bench/agents/bench-agents.mjs,
// `bench_pacer`) writes into each delta the time it emitted it on the
// machine's monotonic clock, and the client subtracts that from the same
// clock when the delta arrives. The runtime batches deltas that come within a
// few milliseconds of each other, so one received delta may hold several
// emit times: each is a sample.
//
// One stream alone; then many concurrent streams at a fixed pace each
// (200 × 50 deltas/s = 10,000 deltas/s); then the pace of every stream
// stepped, below 50 deltas/s and above it until p99 passes 50 ms, for the
// most deltas/s the cluster delivers within it.
import { Redis } from 'ioredis';
import {
  ConversationSocket,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { formatEventLoop, serviceSnapshot } from '../lib/metrics.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { startStreamFloor } from '../lib/stream-floor.mjs';
import { roomChannel } from '../lib/room-channel.mjs';

export const PACER_AGENT = 'bench_pacer';
const USERS = 10;
const READY_TIMEOUT_MS = 60_000;
/** Deltas emitted in the first part of a level are not counted (sockets, timers and JIT settle). */
const WARMUP_S = 1;
/** The figure of the step-up: the most deltas/s delivered with p99 within this. */
export const STEP_P99_MS = 50;

/**
 * Deltas of one answer: a few hundred model tokens. The runtime keeps the
 * step's text so far (in Redis, for late joiners), so a turn's length matters.
 */
export const DELTAS_PER_TURN = 250;

/** Streams of the concurrent level whose first half (emit → Redis) is measured. */
const TAPPED_STREAMS = 10;

const nowNs = () => Number(process.hrtime.bigint());

/**
 * Collects, for every emit time inside the deltas the clients receive, when
 * it arrived and how long after its emission (ms).
 */
class DeltaRecorder {
  constructor() {
    this.reset();
  }

  reset() {
    this.arrivals = [];
    this.emits = [];
    this.latencies = [];
    this.frames = 0;
    this.malformed = 0;
  }

  attach(client) {
    client.socket.on('oh_event', (event) => {
      if (event?.stream !== true || typeof event.delta !== 'string') return;
      const at = nowNs();
      this.frames += 1;
      for (const piece of event.delta.split(' ')) {
        if (piece === '') continue;
        const emittedAt = parseInt(piece, 36) * 1000;
        if (!Number.isFinite(emittedAt)) {
          this.malformed += 1;
          continue;
        }
        this.arrivals.push(at);
        this.emits.push(emittedAt);
        this.latencies.push((at - emittedAt) / 1e6);
      }
    });
  }

  /**
   * The latency of the deltas emitted in [fromNs, toNs] (however late they
   * arrived), and how many deltas arrived per second in that window.
   */
  window(fromNs, toNs) {
    const samples = [];
    let arrived = 0;
    for (let i = 0; i < this.arrivals.length; i += 1) {
      const emitted = this.emits[i];
      if (emitted >= fromNs && emitted <= toNs) samples.push(this.latencies[i]);
      const at = this.arrivals[i];
      if (at >= fromNs && at <= toNs) arrived += 1;
    }
    return {
      latency: summarize(samples),
      deliveredPerSecond: round(arrived / ((toNs - fromNs) / 1e9)),
      deltasPerFrame: this.frames > 0 ? round(this.arrivals.length / this.frames) : null,
      received: this.arrivals.length,
    };
  }
}

/**
 * A subscriber of its own on sharded channels of Redis (`channels`): when the
 * worker's publish of each delta reaches a Redis client, the first half of
 * the path (agent → runtime → Redis), apart from the gateway and Socket.IO.
 */
async function redisTap(cluster, channels) {
  const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: null, protocol: 2 });
  const latencies = [];
  redis.on('smessage', (_channel, raw) => {
    const at = nowNs();
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    if (message?.type !== 'stream' || typeof message.delta?.delta !== 'string') return;
    for (const piece of message.delta.delta.split(' ')) {
      if (piece !== '') latencies.push((at - parseInt(piece, 36) * 1000) / 1e6);
    }
  });
  for (const channel of await Promise.all(channels)) await redis.ssubscribe(channel);
  return {
    reset: () => latencies.splice(0),
    summary: () => summarize(latencies),
    close: () => redis.disconnect(),
  };
}

/**
 * The floor of the path on this machine: a Redis PUBLISH → subscriber hop
 * (as the building blocks measure it, but one every 20 ms, the pace of one
 * stream, so that the processes go idle between, as they do when streaming).
 */
async function idleRedisHop(cluster, count) {
  const publisher = new Redis(cluster.redisUrl, { maxRetriesPerRequest: null, protocol: 2 });
  const subscriber = new Redis(cluster.redisUrl, { maxRetriesPerRequest: null, protocol: 2 });
  const channel = `${cluster.keyPrefix}:bench:idle-hop`;
  let arrived = null;
  subscriber.on('smessage', () => arrived?.(performance.now()));
  try {
    await subscriber.ssubscribe(channel);
    const samples = [];
    for (let i = 0; i < count; i += 1) {
      await sleep(20);
      const waiting = new Promise((resolve) => (arrived = resolve));
      const started = performance.now();
      await publisher.spublish(channel, '{"type":"stream"}');
      samples.push((await waiting) - started);
    }
    return summarize(samples);
  } finally {
    publisher.disconnect();
    subscriber.disconnect();
  }
}

async function openStreams(ctx, count) {
  const { cluster, log } = ctx;
  const gateways = cluster.gateways;
  const clients = [];
  let failed = 0;
  await mapLimit(
    Array.from({ length: count }, (_, i) => i),
    16,
    async (i) => {
      const user = `streaming-${i % USERS}`;
      const token = await ctx.token(user);
      const gateway = gateways[i % gateways.length];
      try {
        const id = await createConversation(gateway.url, token, {
          title: `stream ${i}`,
          agent: PACER_AGENT,
          agent_config: { rate: 50, count: 100 },
        });
        const client = new ConversationSocket(gateway.url, token, id);
        client.stopWith = { url: gateway.url, token };
        clients.push(client);
        await client.connected;
        await client.ready(READY_TIMEOUT_MS);
      } catch (error) {
        failed += 1;
        if (failed <= 3) log(`    opening stream ${i}: ${String(error)}`);
      }
    },
  );
  if (failed > 0) throw new Error(`${failed} of ${count} streams did not open`);
  return clients;
}

/**
 * Every client asks for turns of `DELTAS_PER_TURN` deltas at `rate` deltas/s,
 * one after the other, for `seconds`. The streams are out of phase, as
 * independent users are: each starts at its own moment within one delta
 * interval, and its first turn is of a random length, so that turns end and
 * begin at their own moments too (all at once, every stream's turn would
 * end and the next begin together, a burst no set of users makes). Latency
 * counts the deltas emitted after the warm-up and before the end (however
 * late they arrive); throughput, those that arrived in that window.
 */
async function streamLevel(ctx, clients, recorder, rate, seconds) {
  const { cluster } = ctx;
  recorder.reset();
  const started = nowNs();
  const endsAt = performance.now() + seconds * 1000;
  const meter = startCpuMeter(() => cluster.meterTargets());
  const before = await serviceSnapshot(cluster);
  let errors = 0;
  let firstError = null;
  let expected = 0;
  let turns = 0;
  await Promise.all(
    clients.map(async (client) => {
      await sleep(Math.random() * (1000 / rate));
      let turnLength = Math.ceil(Math.random() * DELTAS_PER_TURN);
      while (performance.now() < endsAt) {
        const left = (endsAt - performance.now()) / 1000;
        const count = Math.max(1, Math.min(turnLength, Math.ceil(left * rate)));
        turnLength = DELTAS_PER_TURN;
        expected += count;
        try {
          await client.roundTrip(JSON.stringify({ rate, count }), (count / rate) * 1000 + 30_000);
          turns += 1;
        } catch (error) {
          errors += 1;
          firstError ??= String(error);
          break;
        }
      }
    }),
  );
  const cpu = meter.stop();
  const after = await serviceSnapshot(cluster);
  const measured = recorder.window(started + WARMUP_S * 1e9, started + seconds * 1e9);
  return {
    streams: clients.length,
    ratePerStream: rate,
    offeredPerSecond: rate * clients.length,
    seconds,
    turns,
    ...measured,
    lost: Math.max(0, expected - recorder.arrivals.length),
    malformed: recorder.malformed,
    errors,
    firstError,
    cpu,
    eventLoop: after.eventLoop,
    eventLoopBefore: before.eventLoop,
  };
}

function describe(level) {
  return (
    `${level.streams} stream(s) × ${level.ratePerStream} deltas/s: ${formatSummary(level.latency)};` +
    ` delivered ${level.deliveredPerSecond}/s of ${level.offeredPerSecond}/s offered,` +
    ` ${level.deltasPerFrame} deltas per frame, lost ${level.lost}, errors ${level.errors}`
  );
}

/**
 * The same two levels (one stream; every stream at 50 deltas/s) through the
 * bare parts alone (bench/lib/stream-floor.mjs), with the service idle: the
 * least this machine takes to carry a delta from a process through Redis and
 * a Socket.IO server to a client.
 */
async function measureFloor(ctx, streams, seconds) {
  const { cluster, log } = ctx;
  const floor = await startStreamFloor({
    redisUrl: cluster.redisUrl,
    keyPrefix: cluster.keyPrefix,
    pairs: Math.min(cluster.gateways.length, cluster.workers.length),
    streams,
  });
  const recorder = new DeltaRecorder();
  for (const client of floor.clients) recorder.attach(client);
  const level = async (count, rate, levelSeconds, tap = null) => {
    await floor.run(rate, 1, count); // unmeasured: warms the path
    recorder.reset();
    tap?.reset();
    const started = nowNs();
    const redis = cluster.meterTargets().filter((t) => t.name === 'redis');
    const meter = startCpuMeter(() => [...floor.meterTargets(), ...redis]);
    await floor.run(rate, levelSeconds, count);
    const cpu = meter.stop();
    return {
      streams: count,
      ratePerStream: rate,
      offeredPerSecond: rate * count,
      seconds: levelSeconds,
      ...recorder.window(started + WARMUP_S * 1e9, started + levelSeconds * 1e9),
      lost: Math.max(0, count * rate * levelSeconds - recorder.arrivals.length),
      cpu,
    };
  };
  try {
    const one = await level(1, 50, seconds);
    log(`  floor (bare parts), one stream: ${describe({ ...one, errors: 0 })}`);
    log(`    ${formatCpu(one.cpu)}`);
    const sampleTap = await redisTap(
      cluster,
      Array.from({ length: Math.min(TAPPED_STREAMS, streams) }, (_, i) => floor.channels[i]),
    );
    let concurrent;
    try {
      concurrent = await level(streams, 50, seconds, sampleTap);
      concurrent.toRedis = sampleTap.summary();
    } finally {
      sampleTap.close();
    }
    log(`  floor (bare parts), concurrent: ${describe({ ...concurrent, errors: 0 })}`);
    log(
      `    of which publish → a Redis subscriber (bench), ${TAPPED_STREAMS} of the streams: ${formatSummary(concurrent.toRedis)}`,
    );
    log(`    ${formatCpu(concurrent.cpu)}`);
    return { one, concurrent };
  } finally {
    floor.close();
  }
}

export async function runStreaming(ctx) {
  const { options, log } = ctx;
  const quick = options.quick;
  const recorder = new DeltaRecorder();
  const clients = [];
  try {
    // One stream, after an unmeasured turn that warms the path.
    const [single] = await openStreams(ctx, 1);
    clients.push(single);
    recorder.attach(single);
    const tap = await redisTap(ctx.cluster, [roomChannel(ctx.cluster, single.conversationId)]);
    let one;
    try {
      await streamLevel(ctx, [single], recorder, 200, quick ? 0.5 : 2);
      tap.reset();
      one = await streamLevel(ctx, [single], recorder, 50, quick ? 3 : options.streamSeconds);
      one.toRedis = tap.summary();
    } finally {
      tap.close();
    }
    log(`  one stream: ${describe(one)}`);
    log(`    of which emit → a Redis subscriber (bench): ${formatSummary(one.toRedis)}`);
    const idleHop = await idleRedisHop(ctx.cluster, quick ? 50 : 250);
    log(`  reference: Redis PUBLISH → subscriber, one every 20 ms: ${formatSummary(idleHop)}`);
    log(`  ${formatCpu(one.cpu)}`);

    const streamCount = quick ? Math.min(20, options.streams) : options.streams;
    const more = await openStreams(ctx, streamCount - 1);
    for (const client of more) {
      clients.push(client);
      recorder.attach(client);
    }
    await streamLevel(ctx, clients, recorder, 50, quick ? 0.5 : 2);
    // The first half of the path for a sample of the streams.
    const sampleTap = await redisTap(
      ctx.cluster,
      clients
        .slice(0, TAPPED_STREAMS)
        .map((client) => roomChannel(ctx.cluster, client.conversationId)),
    );
    let concurrent;
    try {
      concurrent = await streamLevel(ctx, clients, recorder, 50, quick ? 3 : options.streamSeconds);
      concurrent.toRedis = sampleTap.summary();
    } finally {
      sampleTap.close();
    }
    log(`  concurrent: ${describe(concurrent)}`);
    log(
      `    of which emit → a Redis subscriber (bench), ${TAPPED_STREAMS} of the streams: ${formatSummary(concurrent.toRedis)}`,
    );
    log(`  ${formatCpu(concurrent.cpu)}`);
    log(`  ${formatEventLoop(concurrent.eventLoop)}`);

    // The pace of every stream, stepped: below 50 deltas/s (so that the most the cluster
    // delivers within the bound is found even when 10,000/s is past it), then above it
    // until p99 passes the bound (or a turn fails).
    const steps = [];
    const rates = quick ? options.streamRates.slice(0, 2) : options.streamRates;
    /** Runs one stepped level at `rate` deltas/s per stream, records and logs it. */
    const step = async (rate) => {
      const level = await streamLevel(
        ctx,
        clients,
        recorder,
        rate,
        quick ? 2 : options.stepSeconds,
      );
      steps.push(level);
      log(`  step: ${describe(level)}`);
      log(`    ${formatCpu(level.cpu)}`);
      return level;
    };
    for (const rate of [...rates.filter((r) => r < 50)].sort((a, b) => a - b)) await step(rate);
    steps.push(concurrent);
    if (concurrent.latency.p99 <= STEP_P99_MS && concurrent.errors === 0) {
      for (const rate of [...rates.filter((r) => r > 50)].sort((a, b) => a - b)) {
        const level = await step(rate);
        if (level.latency.p99 > STEP_P99_MS || level.errors > 0) break;
      }
    }
    const within = steps.filter((l) => l.latency.p99 !== null && l.latency.p99 <= STEP_P99_MS);
    const best = within.sort((a, b) => b.deliveredPerSecond - a.deliveredPerSecond)[0] ?? null;
    log(
      best
        ? `  most deltas/s with p99 ≤ ${STEP_P99_MS} ms: ${best.deliveredPerSecond}/s (${best.streams} × ${best.ratePerStream}/s, p99 ${best.latency.p99} ms)`
        : `  no level kept p99 ≤ ${STEP_P99_MS} ms`,
    );
    const errors = one.errors + steps.reduce((sum, l) => sum + l.errors, 0);
    for (const client of clients) client.close();
    const floor = await measureFloor(ctx, streamCount, quick ? 3 : options.streamSeconds);
    return { one, idleHop, concurrent, steps, best, floor, errors, cpu: concurrent.cpu };
  } finally {
    for (const client of clients) client.close();
    await mapLimit(clients, 20, (client) =>
      stopConversation(client.stopWith.url, client.stopWith.token, client.conversationId).catch(
        () => undefined,
      ),
    );
  }
}
