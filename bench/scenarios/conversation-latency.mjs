// Latency seen by one client: the round trip of a message to the echo agent,
// the cold start of a stopped conversation, the replay of a long history.
import {
  ConversationSocket,
  api,
  connectConversation,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { formatBreakdown, roundTripBreakdown } from '../lib/breakdown.mjs';
import {
  appendsPerMessage,
  formatAppends,
  formatEventLoop,
  serviceSnapshot,
} from '../lib/metrics.mjs';
import { formatActivity, startActivitySampler } from '../lib/pg-activity.mjs';
import { HISTORY_BATCH, openHistoryStore, seedUserEvents } from '../lib/history.mjs';

const READY_TIMEOUT_MS = 20_000;

/** One conversation, sequential: send a message, wait for the echo, repeat. */
export async function runRoundTrip(ctx) {
  const { cluster, options, log } = ctx;
  const gateway = cluster.gateways[0];
  const token = await ctx.token('round-trip');
  const id = await createConversation(gateway.url, token, { title: 'bench round trip' });
  const conversation = await connectConversation(gateway.url, token, id);
  try {
    await conversation.ready(READY_TIMEOUT_MS);
    const warmup = options.quick ? 20 : options.roundTripWarmup;
    const iterations = options.quick ? 100 : options.roundTrips;
    for (let i = 0; i < warmup; i += 1) await conversation.roundTrip(`warm-up ${i}`);
    const totals = [];
    const acks = [];
    const trips = [];
    let errors = 0;
    const snapshotBefore = await serviceSnapshot(cluster);
    const activity = startActivitySampler(cluster);
    const meter = startCpuMeter(() => cluster.meterTargets());
    const started = performance.now();
    for (let i = 0; i < iterations; i += 1) {
      try {
        const trip = await conversation.roundTrip(`round trip ${i}`);
        totals.push(trip.total);
        acks.push(trip.ack);
        trips.push(trip);
      } catch (error) {
        errors += 1;
        if (errors <= 3) log(`  round trip ${i}: ${String(error)}`);
      }
    }
    const seconds = (performance.now() - started) / 1000;
    const cpu = meter.stop();
    const snapshotAfter = await serviceSnapshot(cluster);
    const postgres = await activity.stop();
    const appends = appendsPerMessage(snapshotBefore, snapshotAfter, totals.length);
    const latency = summarize(totals);
    const ack = summarize(acks);
    log(`  message → echo   ${formatSummary(latency)}`);
    log(`  message → ack    ${formatSummary(ack)}`);
    log(`  ${formatCpu(cpu)}`);
    log(`  ${formatAppends(appends)}`);
    log(`  ${formatEventLoop(snapshotAfter.eventLoop)}`);
    log(`  ${formatActivity(postgres)}`);
    const breakdown = await roundTripBreakdown(
      cluster,
      trips.map((trip) => ({ ...trip, conversationId: id })),
    );
    for (const line of formatBreakdown(breakdown)) log(line);
    return {
      latency,
      ack,
      breakdown,
      appends,
      eventLoop: snapshotAfter.eventLoop,
      postgres,
      throughput: { value: round(totals.length / seconds), unit: 'msg/s (one client, sequential)' },
      errors,
      cpu,
    };
  } finally {
    conversation.close();
    await stopConversation(gateway.url, token, id).catch(() => undefined);
  }
}

/** Connect to a conversation that was created but never started → `awaiting_user_input`. */
export async function runColdStart(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? 10 : options.coldStarts;
  const token = await ctx.token('cold-start');
  const gateways = cluster.gateways;
  const ids = await mapLimit(
    Array.from({ length: count }, (_, i) => i),
    10,
    (i) => createConversation(gateways[i % gateways.length].url, token, { title: `cold ${i}` }),
  );
  const connects = [];
  const readies = [];
  let errors = 0;
  const meter = startCpuMeter(() => cluster.meterTargets());
  for (const [i, id] of ids.entries()) {
    const conversation = new ConversationSocket(gateways[i % gateways.length].url, token, id);
    try {
      await conversation.connected;
      const readyAt = await conversation.ready(READY_TIMEOUT_MS);
      connects.push(conversation.connectedAt - conversation.openedAt);
      readies.push(readyAt - conversation.openedAt);
    } catch (error) {
      errors += 1;
      if (errors <= 3) log(`  cold start ${i}: ${String(error)}`);
    } finally {
      conversation.close();
    }
  }
  const cpu = meter.stop();
  await mapLimit(ids, 10, (id) =>
    stopConversation(gateways[0].url, token, id).catch(() => undefined),
  );
  const latency = summarize(readies);
  const connect = summarize(connects);
  log(`  connect → awaiting_user_input  ${formatSummary(latency)}`);
  log(`  connect (handshake only)       ${formatSummary(connect)}`);
  log(`  ${formatCpu(cpu)}`);
  return { latency, connect, errors, cpu };
}

/** A conversation of 10,000 events, replayed to a client that has none of them. */
export async function runReplay(ctx) {
  const { cluster, options, log } = ctx;
  const gateway = cluster.gateways[0];
  const token = await ctx.token('replay');
  const events = options.replayEvents;
  // The events `replay_json` would store, written through the store: it takes at most 1,000.
  const body = { action: 'message', args: { content: 'x' }, message: 'x' };
  const seededAt = performance.now();
  const id = await createConversation(gateway.url, token, { title: 'bench replay' });
  const opened = await openHistoryStore(cluster);
  try {
    await seedUserEvents(opened.store, 'bench', id, events, body);
  } finally {
    await opened.close();
  }
  const seedMs = performance.now() - seededAt;
  const info = await api(gateway.url, token, 'GET', `/api/conversations/${id}`);
  const lastId = info.last_event_id;
  log(
    `  seeded ${lastId + 1} events in ${Math.round(seedMs)} ms (store.append, ${HISTORY_BATCH} a batch)`,
  );
  const runs = options.quick ? 3 : options.replays;
  const totals = [];
  const firsts = [];
  let errors = 0;
  let outOfOrder = 0;
  const meter = startCpuMeter(() => cluster.meterTargets());
  for (let i = 0; i < runs; i += 1) {
    const conversation = new ConversationSocket(gateways(cluster, i).url, token, id, {
      latestEventId: -1,
      start: false,
    });
    try {
      const first = conversation.waitFor((e) => typeof e.id === 'number', 30_000, 'first event');
      const last = conversation.waitFor((e) => e.id === lastId, 60_000, `event ${lastId}`);
      await conversation.connected;
      const firstAt = await first;
      const lastAt = await last;
      firsts.push(firstAt - conversation.openedAt);
      totals.push(lastAt - conversation.openedAt);
      outOfOrder += conversation.outOfOrder;
      if (conversation.received !== lastId + 1) {
        throw new Error(`received ${conversation.received} events, expected ${lastId + 1}`);
      }
    } catch (error) {
      errors += 1;
      if (errors <= 3) log(`  replay ${i}: ${String(error)}`);
    } finally {
      conversation.close();
    }
  }
  const cpu = meter.stop();
  const latency = summarize(totals);
  const first = summarize(firsts);
  const eventsPerSecond = latency.p50 ? round(((lastId + 1) / latency.p50) * 1000) : null;
  log(`  connect → last of ${lastId + 1} events  ${formatSummary(latency)}`);
  log(`  connect → first event           ${formatSummary(first)}`);
  log(`  ${formatCpu(cpu)}`);
  return {
    events: lastId + 1,
    seedMs: round(seedMs),
    latency,
    first,
    throughput: { value: eventsPerSecond, unit: 'events/s (at p50)' },
    outOfOrder,
    errors,
    cpu,
  };
}

const gateways = (cluster, i) => cluster.gateways[i % cluster.gateways.length];
