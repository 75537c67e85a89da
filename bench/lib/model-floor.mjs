// The floor of a model turn's path on this machine: the model-turn scenario's
// traffic carried by the bare parts the service is built from and nothing
// else. Readers (in the workers' place) each stream their conversations'
// answers from the fake model with the official `openai` SDK, PUBLISH each
// text chunk on the conversation's channel (auto-pipelined, as the workers
// do), then store the answer with one durable INSERT and PUBLISH it; relays
// (bench/lib/stream-floor.mjs, in the gateways' place) emit both on the
// conversation's Socket.IO socket. The service's figure minus this one is
// what the service adds to a model turn.
//
// Run as a child process: `node model-floor.mjs reader <redis-url> <database-url> <model-url>`.
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import pg from 'pg';
import { Redis } from 'ioredis';
import { stampsOf } from './fake-model.mjs';
import { connectToRelay, firstMessage, startRelay } from './stream-floor.mjs';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const nowNs = () => Number(process.hrtime.bigint());
const TABLE = 'bench_model_floor';

/** Runs turns on the channels it is given, each conversation one answer after the other. */
async function reader(redisUrl, databaseUrl, modelUrl) {
  const redis = new Redis(redisUrl, {
    maxRetriesPerRequest: null,
    protocol: 2,
    enableAutoPipelining: true,
  });
  const database = new pg.Pool({ connectionString: databaseUrl, max: 10 });
  const model = new OpenAI({ baseURL: modelUrl, apiKey: 'bench-floor', maxRetries: 0 });
  const insert = {
    name: 'bench_model_floor_insert',
    text: `INSERT INTO ${TABLE} (payload) VALUES ($1)`,
  };
  const converse = async (channel, turns, turnMs) => {
    await sleep(Math.random() * turnMs);
    for (let turn = 0; turn < turns; turn += 1) {
      const stream = await model.chat.completions.create({
        model: 'bench-model',
        messages: [{ role: 'user', content: `question ${turn}` }],
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      for await (const chunk of stream) {
        const delta = chunk.choices[0]?.delta?.content;
        if (!delta) continue;
        const message = {
          type: 'stream',
          delta: { stream: true, cause: turn, delta, offset: text.length },
        };
        redis.spublish(channel, JSON.stringify(message)).catch(() => undefined);
        text += delta;
      }
      await database.query({ ...insert, values: [text] });
      const answer = { source: 'agent', action: 'message', cause: turn, args: { content: text } };
      redis
        .spublish(channel, JSON.stringify({ type: 'events', events: [answer] }))
        .catch(() => undefined);
    }
  };
  process.on('message', async ({ channels, turns, turnMs }) => {
    await Promise.all(channels.map((channel) => converse(channel, turns, turnMs)));
    process.send({ done: true });
  });
  await Promise.all([redis.ping(), database.query('SELECT 1')]);
  process.send({ ready: true });
}

/**
 * Starts `pairs` relays and readers, a scratch table, and one Socket.IO
 * client per conversation. `run(conversations, turns, warmup)` runs every
 * conversation's turns (out of phase, as in the scenario) and answers the
 * latencies of the turns after the warm-up: `{ first, final }` in ms.
 */
export async function startModelFloor({
  redisUrl,
  databaseUrl,
  modelUrl,
  keyPrefix,
  pairs,
  conversations,
}) {
  const admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  await admin.query(`CREATE TABLE IF NOT EXISTS ${TABLE} (id bigserial PRIMARY KEY, payload text)`);
  await admin.end();
  const children = [];
  try {
    const relays = [];
    for (let i = 0; i < pairs; i += 1) {
      const relay = await startRelay(redisUrl);
      children.push({ role: 'relay', index: i, child: relay.child });
      relays.push(relay);
    }
    const readers = [];
    for (let i = 0; i < pairs; i += 1) {
      const child = fork(
        fileURLToPath(import.meta.url),
        ['reader', redisUrl, databaseUrl, modelUrl],
        {
          stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
        },
      );
      children.push({ role: 'reader', index: i, child });
      await firstMessage(child);
      readers.push(child);
    }
    const channels = Array.from(
      { length: conversations },
      (_, i) => `${keyPrefix}:model-floor:${i}`,
    );
    const turnsSeen = channels.map(() => new Map()); // turn → { first, final }
    const sockets = await Promise.all(
      channels.map(async (channel, c) => {
        const socket = await connectToRelay(relays[c % pairs].hello.port, channel);
        socket.on('oh_event', (event) => {
          const at = nowNs();
          const seen = turnsSeen[c];
          let turn = seen.get(event.cause);
          if (!turn) {
            turn = {};
            seen.set(event.cause, turn);
          }
          if (event.stream === true) turn.first ??= (at - stampsOf(event.delta)[0]) / 1e6;
          else turn.final = (at - stampsOf(event.args.content).at(-1)) / 1e6;
        });
        return socket;
      }),
    );
    return {
      meterTargets: () =>
        children.map(({ role, index, child }) => ({
          name: `${role === 'relay' ? 'gateway' : 'worker'}-floor-${index + 1}`,
          pid: child.pid,
        })),
      async run(count, turns, warmup, turnMs) {
        for (const seen of turnsSeen) seen.clear();
        await Promise.all(
          readers.map((child, r) => {
            const mine = channels.slice(0, count).filter((_, i) => i % pairs === r);
            const done = firstMessage(child);
            child.send({ channels: mine, turns: warmup + turns, turnMs });
            return done;
          }),
        );
        await sleep(200); // the last answers are on their way
        const first = [];
        const final = [];
        for (const seen of turnsSeen.slice(0, count)) {
          for (const [turn, { first: f, final: l }] of seen) {
            if (turn < warmup) continue;
            if (f !== undefined) first.push(f);
            if (l !== undefined) final.push(l);
          }
        }
        return { first, final, expected: count * turns };
      },
      close() {
        for (const socket of sockets) socket.close();
        for (const { child } of children) child.kill();
      },
    };
  } catch (error) {
    for (const { child } of children) child.kill();
    throw error;
  }
}

const [role, ...args] = process.argv.slice(2);
if (role === 'reader') await reader(...args);
