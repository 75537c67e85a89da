// The service's overhead on a model turn: the `llm` agent against the bench's
// fake OpenAI-compatible server (bench/lib/fake-model.mjs, in a process of its
// own, at a fixed time to first token and token rate). Every token the server
// writes carries the time it wrote it on the machine's monotonic clock, so the
// client tells how long after the model's first chunk its first delta came,
// and how long after the model's last chunk the stored final message came:
// what the service adds to what the model takes. One conversation turn after
// turn, then many conversations at once.
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import {
  ConversationSocket,
  createConversation,
  mapLimit,
  stopConversation,
} from '../lib/client.mjs';
import { sleep } from '../lib/cluster.mjs';
import { formatCpu, startCpuMeter } from '../lib/proc.mjs';
import {
  appendsPerMessage,
  formatAppends,
  formatEventLoop,
  serviceSnapshot,
} from '../lib/metrics.mjs';
import { formatSummary, round, summarize } from '../lib/stats.mjs';
import { startModelFloor } from '../lib/model-floor.mjs';
import { stampsOf } from '../lib/fake-model.mjs';
import { roomChannel } from '../lib/room-channel.mjs';

const USERS = 10;
const READY_TIMEOUT_MS = 60_000;
const TURN_TIMEOUT_MS = 30_000;

const nowNs = () => Number(process.hrtime.bigint());

/** A conversation with the `llm` agent whose client records when each turn's deltas and answer arrived. */
class ModelConversation {
  constructor(client) {
    this.client = client;
    this.turns = new Map(); // cause → { firstDeltaAt, firstDelta, deltas: [latency ms] }
    client.socket.on('oh_event', (event) => {
      if (event?.stream !== true || typeof event.delta !== 'string') return;
      const at = nowNs();
      let turn = this.turns.get(event.cause);
      if (!turn) {
        turn = { firstDeltaAt: at, firstDelta: event.delta, deltas: [] };
        this.turns.set(event.cause, turn);
      }
      for (const written of stampsOf(event.delta)) turn.deltas.push((at - written) / 1e6);
    });
  }

  /** One turn: `{ first, final, deltas }` in ms after the model's chunks. */
  async turn(content) {
    const answerPromise = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.client.watchers.delete(watcher);
        reject(new Error(`no answer within ${TURN_TIMEOUT_MS} ms`));
      }, TURN_TIMEOUT_MS);
      const watcher = (event) => {
        if (event.source !== 'agent' || event.action !== 'message') return;
        clearTimeout(timer);
        this.client.watchers.delete(watcher);
        resolve({ event, at: nowNs() });
      };
      this.client.watchers.add(watcher);
    });
    const ack = await this.client.socket
      .timeout(TURN_TIMEOUT_MS)
      .emitWithAck('oh_user_action', { action: 'message', args: { content } });
    if (!ack?.ok) throw new Error(`user action refused: ${JSON.stringify(ack?.error)}`);
    const { event, at } = await answerPromise;
    if (event.cause !== ack.event_id)
      throw new Error(`answer to ${event.cause}, not ${ack.event_id}`);
    const turn = this.turns.get(ack.event_id);
    this.turns.delete(ack.event_id);
    const written = stampsOf(event.args?.content ?? '');
    if (!turn || written.length === 0) throw new Error('an answer without deltas or stamps');
    return {
      first: (turn.firstDeltaAt - stampsOf(turn.firstDelta)[0]) / 1e6,
      final: (at - written[written.length - 1]) / 1e6,
      deltas: turn.deltas,
      trace: {
        cause: ack.event_id,
        answerId: event.id,
        lastChunkNs: written[written.length - 1],
        finalAtNs: at,
      },
    };
  }
}

/**
 * For reference, the client library alone: the official `openai` SDK (what
 * the `llm` agent runs on), in the bench process, against the same fake
 * model, one request after the other: the model's first chunk → the first
 * text chunk, its last chunk → the chunk with the finish reason and → the
 * end of the stream, and the CPU time a request costs the process.
 */
async function sdkAlone(model, requests, warmup) {
  const client = new OpenAI({ baseURL: model.url, apiKey: 'bench-key', maxRetries: 0 });
  const firsts = [];
  const finishes = [];
  const ends = [];
  let cpuUs = 0;
  for (let i = 0; i < warmup + requests; i += 1) {
    const cpuBefore = process.cpuUsage();
    const stream = await client.chat.completions.create({
      model: 'bench-model',
      messages: [{ role: 'user', content: 'question' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    let first = null;
    let finish = null;
    let text = '';
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (choice?.delta?.content) {
        first ??= nowNs() - stampsOf(choice.delta.content)[0];
        text += choice.delta.content;
      }
      if (choice?.finish_reason) finish = nowNs();
    }
    const end = nowNs();
    const cpu = process.cpuUsage(cpuBefore);
    if (i < warmup) continue;
    const last = stampsOf(text).at(-1);
    firsts.push(first / 1e6);
    if (finish !== null) finishes.push((finish - last) / 1e6);
    ends.push((end - last) / 1e6);
    cpuUs += cpu.user + cpu.system;
  }
  return {
    first: summarize(firsts),
    finish: summarize(finishes),
    end: summarize(ends),
    cpuMsPerRequest: round(cpuUs / 1000 / requests),
  };
}

async function openConversations(ctx, count) {
  const { cluster } = ctx;
  const gateways = cluster.gateways;
  return mapLimit(
    Array.from({ length: count }, (_, i) => i),
    16,
    async (i) => {
      const token = await ctx.token(`model-turn-${i % USERS}`);
      const gateway = gateways[i % gateways.length];
      // A title: an untitled conversation would make one more model request after its first answer.
      const id = await createConversation(gateway.url, token, {
        title: `model turn ${i}`,
        agent: 'llm',
      });
      const client = new ConversationSocket(gateway.url, token, id);
      client.stopWith = { url: gateway.url, token };
      await client.connected;
      await client.ready(READY_TIMEOUT_MS);
      return new ModelConversation(client);
    },
  );
}

/** Every conversation runs `turns` turns one after the other (the first `warmup` not counted). */
async function drive(ctx, conversations, turns, warmup) {
  const { cluster } = ctx;
  const firsts = [];
  const finals = [];
  const deltas = [];
  const traces = [];
  let errors = 0;
  let firstError = null;
  let meter = null;
  let before = null;
  const warmed = new Set();
  const measuring = (async () => {
    // The window opens once every conversation is past its warm-up.
    while (warmed.size < conversations.length) await sleep(20);
    meter = startCpuMeter(() => cluster.meterTargets());
    before = await serviceSnapshot(cluster);
  })();
  // Out of phase, as independent users are: each conversation starts at its
  // own moment within one turn's length, and again after the warm-up (the
  // wait for every warm-up to end would otherwise line them all up, and each
  // turn would end together with all the others).
  const { ttftMs, tokenMs, tokens } = ctx.model.settings;
  const turnMs = ttftMs + tokens * tokenMs;
  await Promise.all(
    conversations.map(async (conversation, c) => {
      await sleep(Math.random() * turnMs);
      for (let i = 0; i < warmup + turns; i += 1) {
        if (i === warmup) {
          warmed.add(c);
          await measuring;
          await sleep(Math.random() * turnMs);
        }
        try {
          const turn = await conversation.turn(`question ${i}`);
          if (i < warmup) continue;
          firsts.push(turn.first);
          finals.push(turn.final);
          for (const d of turn.deltas) deltas.push(d);
          traces.push({ ...turn.trace, conversationId: conversation.client.conversationId });
        } catch (error) {
          errors += 1;
          firstError ??= String(error);
        }
      }
      warmed.add(c);
    }),
  );
  await measuring;
  const cpu = meter.stop();
  const after = await serviceSnapshot(cluster);
  const workerPercent = Object.entries(cpu.processes)
    .filter(([name]) => name.startsWith('worker'))
    .reduce((sum, [, value]) => sum + (value ?? 0), 0);
  const measuredTurns = firsts.length;
  return {
    conversations: conversations.length,
    turns,
    // The workers' CPU time per measured turn (everything they did in the window, over its turns).
    workerCpuMsPerTurn:
      measuredTurns > 0
        ? round(((workerPercent / 100) * cpu.seconds * 1000) / measuredTurns)
        : null,
    first: summarize(firsts),
    final: summarize(finals),
    deltas: summarize(deltas),
    errors,
    firstError,
    cpu,
    eventLoop: after.eventLoop,
    eventLoopBefore: before.eventLoop,
    // Appends per turn by writer (gateway, worker) and their mean time in the service.
    appends: appendsPerMessage(before, after, measuredTurns),
    traces,
  };
}

/**
 * Where the single conversation's time goes: the model's first chunk → the
 * worker's publish of the first delta reaching a Redis subscriber of the
 * bench's own (then the client), and the model's last chunk → the answer
 * stamped in Postgres (its `created_at`, taken in the append) → the client.
 * Postgres stamps wall-clock time; the bench converts it to the monotonic
 * clock with the offset between the two in its own process.
 */
async function breakdown(cluster, traces, tap) {
  const wallMinusMonotonicMs =
    performance.timeOrigin + performance.now() - Number(process.hrtime.bigint()) / 1e6;
  const toRedis = [];
  for (const trace of traces) {
    const published = tap.first.get(trace.cause);
    if (published) toRedis.push((published.at - published.stamp) / 1e6);
  }
  const answerToRedis = [];
  const redisToClient = [];
  for (const trace of traces) {
    const published = tap.answers.get(trace.cause);
    if (published === undefined) continue;
    answerToRedis.push((published - trace.lastChunkNs) / 1e6);
    redisToClient.push((trace.finalAtNs - published) / 1e6);
  }
  const stamped = [];
  const delivered = [];
  if (traces.length > 0) {
    const { rows } = await cluster.db.query(
      `SELECT id, (extract(epoch FROM created_at) * 1000)::float8 AS at
         FROM events WHERE conversation_id = $1 AND id = ANY($2::bigint[])`,
      [traces[0].conversationId, traces.map((t) => t.answerId)],
    );
    const at = new Map(rows.map((row) => [Number(row.id), row.at]));
    for (const trace of traces) {
      const wall = at.get(trace.answerId);
      if (wall === undefined) continue;
      const stampedNs = (wall - wallMinusMonotonicMs) * 1e6;
      stamped.push((stampedNs - trace.lastChunkNs) / 1e6);
      delivered.push((trace.finalAtNs - stampedNs) / 1e6);
    }
  }
  return {
    firstToRedis: summarize(toRedis),
    lastToStored: summarize(stamped),
    storedToClient: summarize(delivered),
    lastToRedis: summarize(answerToRedis),
    redisToClient: summarize(redisToClient),
  };
}

/** A subscriber of the bench's own on a conversation's room: when each turn's first delta was published. */
async function roomTap(cluster, conversationId) {
  const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: null, protocol: 2 });
  const first = new Map(); // cause → { at, stamp } (ns)
  const answers = new Map(); // cause → when the answer's publish reached the tap (ns)
  redis.on('smessage', (_channel, raw) => {
    const at = nowNs();
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    if (message?.type === 'events') {
      for (const event of message.events ?? [])
        if (event.source === 'agent' && event.action === 'message') answers.set(event.cause, at);
      return;
    }
    const delta = message?.type === 'stream' ? message.delta : null;
    if (!delta || typeof delta.delta !== 'string' || first.has(delta.cause)) return;
    const [stamp] = stampsOf(delta.delta);
    if (stamp !== undefined) first.set(delta.cause, { at, stamp });
  });
  await redis.ssubscribe(await roomChannel(cluster, conversationId));
  return { first, answers, close: () => redis.disconnect() };
}

function describe(name, level, log) {
  log(`  ${name}: model's first chunk → client's first delta  ${formatSummary(level.first)}`);
  log(`  ${name}: model's last chunk → client's final message ${formatSummary(level.final)}`);
  log(`  ${name}: each token, model → client                  ${formatSummary(level.deltas)}`);
  if (level.errors > 0) log(`  ${name}: errors ${level.errors} (${level.firstError})`);
  log(`  ${name}: the workers' CPU per turn ${level.workerCpuMsPerTurn} ms`);
  log(`  ${name}: ${formatAppends(level.appends)}`);
  log(`  ${formatCpu(level.cpu)}`);
}

export async function runModelTurn(ctx) {
  const { options, log, model } = ctx;
  if (!model) throw new Error('the fake model server is not running');
  const quick = options.quick;
  const { ttftMs, tokenMs, tokens } = model.settings;
  log(
    `  fake model: first token after ${ttftMs} ms, then a token every ${tokenMs} ms` +
      ` (${Math.round(1000 / tokenMs)} tokens/s), ${tokens} tokens an answer`,
  );
  const sdk = await sdkAlone(model, quick ? 3 : 12, quick ? 1 : 2);
  log(`  reference, the openai SDK alone (in the bench process, same fake model):`);
  log(`    model's first chunk → first text chunk       ${formatSummary(sdk.first)}`);
  log(`    model's last chunk → finish reason           ${formatSummary(sdk.finish)}`);
  log(`    model's last chunk → end of the stream       ${formatSummary(sdk.end)}`);
  log(`    CPU per request ${sdk.cpuMsPerRequest} ms`);
  const open = [];
  let result;
  try {
    const [single] = await openConversations(ctx, 1);
    open.push(single);
    const tap = await roomTap(ctx.cluster, single.client.conversationId);
    let one;
    try {
      one = await drive(ctx, [single], quick ? 3 : options.modelTurns, quick ? 1 : 2);
      one.breakdown = await breakdown(ctx.cluster, one.traces, tap);
    } finally {
      tap.close();
    }
    describe('1 conversation', one, log);
    logBreakdown(one.breakdown, log);

    const count = quick ? Math.min(10, options.modelConversations) : options.modelConversations;
    const many = await openConversations(ctx, count);
    open.push(...many);
    // The same breakdown, of one of them.
    const manyTap = await roomTap(ctx.cluster, many[0].client.conversationId);
    let concurrent;
    try {
      concurrent = await drive(ctx, many, quick ? 2 : 3, 1);
      const tapped = concurrent.traces.filter(
        (trace) => trace.conversationId === many[0].client.conversationId,
      );
      concurrent.breakdown = await breakdown(ctx.cluster, tapped, manyTap);
    } finally {
      manyTap.close();
    }
    describe(`${count} conversations`, concurrent, log);
    logBreakdown(concurrent.breakdown, log);
    log(`  ${formatEventLoop(concurrent.eventLoop)}`);
    delete one.traces;
    delete concurrent.traces;
    result = {
      model: model.settings,
      sdk,
      one,
      concurrent,
      errors: one.errors + concurrent.errors,
      cpu: concurrent.cpu,
    };
  } finally {
    for (const conversation of open) conversation.client.close();
    await mapLimit(open, 20, ({ client }) =>
      stopConversation(client.stopWith.url, client.stopWith.token, client.conversationId).catch(
        () => undefined,
      ),
    );
  }
  // With the service idle: the same turns through the bare parts alone.
  result.floor = await measureFloor(ctx, result.one.turns, result.concurrent);
  return result;
}

/**
 * The same two levels (one conversation; all of them) through the bare parts
 * alone (bench/lib/model-floor.mjs): the openai SDK reading the fake model,
 * PUBLISH of each chunk, one durable INSERT of the answer and its PUBLISH, a
 * Socket.IO relay. The least this machine takes to carry a model's chunk to a
 * client, and its answer once stored.
 */
async function measureFloor(ctx, turns, concurrent) {
  const { cluster, model, log, options } = ctx;
  const { ttftMs, tokenMs, tokens } = model.settings;
  const floor = await startModelFloor({
    redisUrl: cluster.redisUrl,
    databaseUrl: cluster.databaseUrl,
    modelUrl: model.url,
    keyPrefix: cluster.keyPrefix,
    pairs: Math.min(cluster.gateways.length, cluster.workers.length),
    conversations: concurrent.conversations,
  });
  const level = async (count, levelTurns, warmup) => {
    const meter = startCpuMeter(() => [
      ...floor.meterTargets(),
      ...cluster.meterTargets().filter((t) => t.name === 'redis' || t.name === 'postgres'),
    ]);
    const run = await floor.run(count, levelTurns, warmup, ttftMs + tokens * tokenMs);
    return {
      conversations: count,
      turns: levelTurns,
      first: summarize(run.first),
      final: summarize(run.final),
      missing: run.expected - run.final.length,
      cpu: meter.stop(),
    };
  };
  try {
    const one = await level(1, turns, options.quick ? 1 : 2);
    const concurrentFloor = await level(concurrent.conversations, concurrent.turns, 1);
    for (const [name, level] of [
      ['1 conversation', one],
      [`${concurrent.conversations} conversations`, concurrentFloor],
    ]) {
      log(
        `  floor (bare parts), ${name}: model's first chunk → client's first delta  ${formatSummary(level.first)}`,
      );
      log(
        `  floor (bare parts), ${name}: model's last chunk → client's final message ${formatSummary(level.final)}`,
      );
      log(
        `    ${formatCpu(level.cpu)}${level.missing > 0 ? `; ${level.missing} answers missing` : ''}`,
      );
    }
    return { one, concurrent: concurrentFloor };
  } finally {
    floor.close();
  }
}

/** Where a turn's time went, for the conversation the bench taps. */
function logBreakdown(breakdown, log) {
  log(
    `    first chunk → first delta at a Redis subscriber (bench) ${formatSummary(breakdown.firstToRedis)}`,
  );
  log(
    `    last chunk → answer stamped in Postgres               ${formatSummary(breakdown.lastToStored)}`,
  );
  log(
    `    answer stamped → answer at the client                 ${formatSummary(breakdown.storedToClient)}`,
  );
  log(
    `    last chunk → answer at a Redis subscriber (bench)     ${formatSummary(breakdown.lastToRedis)}`,
  );
  log(
    `    answer at a Redis subscriber → answer at the client   ${formatSummary(breakdown.redisToClient)}`,
  );
}
