// The building blocks a round trip is made of, measured alone on the same
// machine in the same run: a Socket.IO acknowledgement, a Redis PUBLISH to a
// subscriber, the Socket.IO sharded Redis adapter to another, a durable Postgres
// INSERT (and an append-shaped statement), a BullMQ job from add to its
// processor.
import { createServer } from 'node:http';
import { createShardedAdapter } from '@socket.io/redis-adapter';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import pg from 'pg';
import { Server } from 'socket.io';
import { io } from 'socket.io-client';
import { summarize, formatSummary } from '../lib/stats.mjs';

const TIMEOUT_MS = 5_000;

/** Times `once()` sequentially: `warmup` discarded runs, then `count` samples. */
async function sample(count, warmup, once) {
  for (let i = 0; i < warmup; i += 1) await once(i);
  const samples = [];
  for (let i = 0; i < count; i += 1) samples.push(await once(i));
  return samples;
}

/** A promise resolved by a later call, with a timeout; one at a time. */
function oneShot() {
  let pending = null;
  return {
    wait() {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('building block timed out')), TIMEOUT_MS);
        pending = (value) => {
          clearTimeout(timer);
          resolve(value);
        };
      });
    },
    fire(value) {
      const resolve = pending;
      pending = null;
      resolve?.(value);
    },
  };
}

const redisOptions = { maxRetriesPerRequest: null, protocol: 2 };

async function socketAck(count, warmup) {
  const http = createServer();
  const server = new Server(http, { transports: ['websocket'] });
  server.on('connection', (socket) => socket.on('ping', (payload, ack) => ack(payload)));
  await new Promise((resolve) => http.listen(0, '127.0.0.1', resolve));
  const client = io(`http://127.0.0.1:${http.address().port}`, {
    transports: ['websocket'],
    forceNew: true,
    reconnection: false,
  });
  try {
    await new Promise((resolve, reject) => {
      client.once('connect', resolve);
      client.once('connect_error', reject);
    });
    const payload = { action: 'message', args: { content: 'hello' } };
    return await sample(count, warmup, async () => {
      const started = performance.now();
      await client.timeout(TIMEOUT_MS).emitWithAck('ping', payload);
      return performance.now() - started;
    });
  } finally {
    client.disconnect();
    await server.close();
  }
}

async function redisHop(redisUrl, prefix, count, warmup) {
  const publisher = new Redis(redisUrl, redisOptions);
  const subscriber = new Redis(redisUrl, redisOptions);
  const channel = `${prefix}:bench:hop`;
  const arrival = oneShot();
  try {
    subscriber.on('smessage', () => arrival.fire(performance.now()));
    await subscriber.ssubscribe(channel);
    return await sample(count, warmup, async () => {
      const waiting = arrival.wait();
      const started = performance.now();
      await publisher.spublish(channel, '{"type":"wake"}');
      return (await waiting) - started;
    });
  } finally {
    publisher.disconnect();
    subscriber.disconnect();
  }
}

/**
 * One gateway's Socket.IO adapter to another's, as the gateways use it (the
 * sharded adapter in `static` mode, SPUBLISH → SSUBSCRIBE), for reference:
 * the conversations' live traffic does not take it, but a conversation's own
 * channel (a plain PUBLISH → subscriber hop), which only the gateways with a
 * subscriber to that conversation receive.
 */
async function adapterHop(redisUrl, prefix, count, warmup) {
  const clients = Array.from({ length: 4 }, () => new Redis(redisUrl, redisOptions));
  const key = `${prefix}:bench:socket.io`;
  // Attached to HTTP servers that never listen: only the adapters are used.
  const [sender, receiver] = [0, 1].map((n) => {
    const server = new Server(createServer());
    server.adapter(
      createShardedAdapter(clients[2 * n], clients[2 * n + 1], {
        channelPrefix: key,
        subscriptionMode: 'static',
      }),
    );
    return server;
  });
  const arrival = oneShot();
  receiver.on('bench:events', () => arrival.fire(performance.now()));
  const event = {
    id: 12,
    timestamp: new Date().toISOString(),
    source: 'agent',
    action: 'message',
    args: { content: 'echo: hello' },
    message: 'echo: hello',
    cause: 11,
  };
  try {
    await new Promise((resolve) => setTimeout(resolve, 200)); // the adapters' SSUBSCRIBEs
    return await sample(count, warmup, async () => {
      const waiting = arrival.wait();
      const started = performance.now();
      sender.serverSideEmit('bench:events', 'conversation-id', [event]);
      return (await waiting) - started;
    });
  } finally {
    await Promise.all([sender.close(), receiver.close()]);
    for (const client of clients) client.disconnect();
  }
}

async function postgresInsert(databaseUrl, count, warmup) {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query(`CREATE TABLE IF NOT EXISTS bench_scratch (
      id bigserial PRIMARY KEY, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`);
    const payload = JSON.stringify({ action: 'message', args: { content: 'hello' } });
    const insert = {
      name: 'bench_scratch_insert',
      text: 'INSERT INTO bench_scratch (payload) VALUES ($1)',
      values: [payload],
    };
    return await sample(count, warmup, async () => {
      const started = performance.now();
      await client.query(insert);
      return performance.now() - started;
    });
  } finally {
    await client.end();
  }
}

/**
 * The statements of one `EventLog.append` (BEGIN, lock the head row, update
 * it, insert the event, COMMIT) on a scratch pair of tables: what an append
 * costs at the database before any service code runs.
 */
/**
 * An append shaped like the service's: one statement that moves a head row's
 * last id on and inserts the event with the id it returned (a CTE), durable.
 */
async function postgresAppendStatement(databaseUrl, count, warmup) {
  const client = new pg.Client({ connectionString: databaseUrl });
  await client.connect();
  try {
    await client.query(`CREATE TABLE IF NOT EXISTS bench_head (
      id int PRIMARY KEY, last_event_id bigint NOT NULL, updated_at timestamptz NOT NULL)`);
    await client.query(`CREATE TABLE IF NOT EXISTS bench_log (
      head_id int NOT NULL, id bigint NOT NULL, payload jsonb NOT NULL, PRIMARY KEY (head_id, id))`);
    await client.query(`INSERT INTO bench_head VALUES (1, -1, now()) ON CONFLICT (id) DO NOTHING`);
    const payload = JSON.stringify({ action: 'message', args: { content: 'hello' } });
    return await sample(count, warmup, async () => {
      const started = performance.now();
      await client.query({
        name: 'bench_append',
        text: `WITH head AS (
                 UPDATE bench_head SET last_event_id = last_event_id + 1,
                        updated_at = clock_timestamp()
                  WHERE id = 1 RETURNING last_event_id)
               INSERT INTO bench_log (head_id, id, payload)
               SELECT 1, head.last_event_id, $1::jsonb FROM head`,
        values: [payload],
      });
      return performance.now() - started;
    });
  } finally {
    await client.end();
  }
}

async function bullmqPickup(redisUrl, prefix, count, warmup) {
  const connection = new Redis(redisUrl, redisOptions);
  const workerConnection = new Redis(redisUrl, redisOptions);
  const name = 'bench-blocks';
  const queue = new Queue(name, {
    connection,
    prefix,
    defaultJobOptions: { removeOnComplete: true, removeOnFail: true },
  });
  const arrival = oneShot();
  const worker = new Worker(
    name,
    async () => {
      arrival.fire(performance.now());
    },
    { connection: workerConnection, prefix, concurrency: 1 },
  );
  try {
    await worker.waitUntilReady();
    return await sample(count, warmup, async (i) => {
      const waiting = arrival.wait();
      const started = performance.now();
      await queue.add('run', { i });
      return (await waiting) - started;
    });
  } finally {
    await worker.close();
    await queue.obliterate({ force: true }).catch(() => undefined);
    await queue.close();
    connection.disconnect();
    workerConnection.disconnect();
  }
}

export async function runBuildingBlocks(ctx) {
  const { cluster, options, log } = ctx;
  const count = options.quick ? 200 : 1000;
  const warmup = options.quick ? 20 : 100;
  const blocks = {};
  const measure = async (key, label, fn) => {
    blocks[key] = { label, ...summarize(await fn()) };
    log(`  ${label.padEnd(42)} ${formatSummary(blocks[key])}`);
  };
  await measure('socketio_ack', 'Socket.IO ack round trip (in-process)', () =>
    socketAck(count, warmup),
  );
  await measure('redis_hop', 'Redis PUBLISH → subscriber', () =>
    redisHop(cluster.redisUrl, cluster.keyPrefix, count, warmup),
  );
  await measure('adapter_hop', 'Socket.IO sharded adapter → adapter', () =>
    adapterHop(cluster.redisUrl, cluster.keyPrefix, count, warmup),
  );
  await measure('pg_insert', 'Postgres INSERT (autocommit, durable)', () =>
    postgresInsert(cluster.databaseUrl, count, warmup),
  );
  await measure('pg_append', 'Postgres append-shaped statement (durable)', () =>
    postgresAppendStatement(cluster.databaseUrl, count, warmup),
  );
  await measure('bullmq_pickup', 'BullMQ add → processor start', () =>
    bullmqPickup(cluster.redisUrl, cluster.keyPrefix, Math.min(count, 500), warmup),
  );
  return { blocks };
}

/** The sum of one percentile of the named blocks (a name twice counts twice), or null if one is missing. */
function pathSum(blocks, percentileKey, names) {
  const parts = names.map((name) => blocks[name]?.[percentileKey]);
  if (parts.some((value) => typeof value !== 'number')) return null;
  return parts.reduce((a, b) => a + b, 0);
}

/**
 * The round trip's path in building blocks: socket ack + 2 × Postgres insert +
 * 2 × Redis hop (the wake-up to the worker, the answer to the gateway).
 */
export function roundTripBudget(blocks, percentileKey) {
  return pathSum(blocks, percentileKey, [
    'socketio_ack',
    'pg_insert',
    'pg_insert',
    'redis_hop',
    'redis_hop',
  ]);
}

/**
 * The path as the service builds it: socket ack + 2 append-shaped statements
 * (the user event; `running`, the answer and `awaiting_user_input` together) +
 * 2 × Redis hop (the wake-up, the answer).
 */
export function builtPathBudget(blocks, percentileKey) {
  return pathSum(blocks, percentileKey, [
    'socketio_ack',
    'pg_append',
    'pg_append',
    'redis_hop',
    'redis_hop',
  ]);
}
