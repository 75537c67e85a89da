// The floor of a streamed delta's path on this machine: the streaming
// scenario's traffic carried by the bare parts the service is built from and
// nothing else. Publishers (in the workers' place) PUBLISH each delta on a
// room channel of its own with an auto-pipelined ioredis connection, as the
// workers do; relays (in the gateways' place) subscribe to those channels
// and emit each message on its client's Socket.IO socket, as the gateways
// do. The service's figure minus this one is what the service adds.
//
// Run as a child process: `node stream-floor.mjs relay <redis-url>` or
// `node stream-floor.mjs publisher <redis-url>` (both speak over IPC).
import { fork } from 'node:child_process';
import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { Server } from 'socket.io';
import { io } from 'socket.io-client';

const redisOptions = { maxRetriesPerRequest: null, protocol: 2 };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Subscribes to the channel a client names and emits what arrives on it (deltas, events) to that client. */
async function relay(redisUrl) {
  const subscriber = new Redis(redisUrl, redisOptions);
  const sockets = new Map();
  subscriber.on('smessage', (channel, raw) => {
    const socket = sockets.get(channel);
    if (!socket) return;
    const message = JSON.parse(raw);
    if (message.type === 'stream') socket.emit('oh_event', message.delta);
    else if (message.type === 'events')
      for (const event of message.events) socket.emit('oh_event', event);
  });
  const http = createServer();
  const server = new Server(http, { transports: ['websocket'], serveClient: false });
  server.on('connection', async (socket) => {
    const channel = String(socket.handshake.query.channel);
    sockets.set(channel, socket);
    socket.on('disconnect', () => {
      sockets.delete(channel);
      subscriber.sunsubscribe(channel).catch(() => undefined);
    });
    await subscriber.ssubscribe(channel);
    socket.emit('ready');
  });
  await new Promise((resolve) => http.listen(0, '127.0.0.1', resolve));
  process.send({ port: http.address().port });
}

/** Streams deltas on the channels it is given, paced as the bench's `bench_pacer` agent. */
async function publisher(redisUrl) {
  const redis = new Redis(redisUrl, { ...redisOptions, enableAutoPipelining: true });
  const stream = async (channel, rate, seconds) => {
    await sleep(Math.random() * (1000 / rate));
    const started = performance.now();
    const count = Math.max(1, Math.round(rate * seconds));
    let emitted = 0;
    let text = 0;
    while (emitted < count) {
      const due = Math.min(count, Math.floor(((performance.now() - started) * rate) / 1000) + 1);
      while (emitted < due) {
        const delta = `${(process.hrtime.bigint() / 1000n).toString(36)} `;
        const message = { type: 'stream', delta: { stream: true, cause: 1, delta, offset: text } };
        redis.spublish(channel, JSON.stringify(message)).catch(() => undefined);
        text += delta.length;
        emitted += 1;
      }
      if (emitted >= count) break;
      await sleep(Math.max(0, started + (emitted * 1000) / rate - performance.now()));
    }
  };
  process.on('message', async ({ channels, rate, seconds }) => {
    await Promise.all(channels.map((channel) => stream(channel, rate, seconds)));
    process.send({ done: true });
  });
  await redis.ping();
  process.send({ ready: true });
}

export function firstMessage(child) {
  return new Promise((resolve, reject) => {
    child.once('message', resolve);
    child.once('exit', (code) => reject(new Error(`stream floor child exited (${code})`)));
  });
}

/** A relay (`node stream-floor.mjs relay`): `{ child, hello: { port } }`. */
export async function startRelay(redisUrl) {
  const child = fork(fileURLToPath(import.meta.url), ['relay', redisUrl], {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  try {
    return { child, hello: await firstMessage(child) };
  } catch (error) {
    child.kill();
    throw error;
  }
}

/** A Socket.IO client of a relay on `channel`, once the relay has subscribed to it. */
export async function connectToRelay(port, channel) {
  const socket = io(`http://127.0.0.1:${port}`, {
    transports: ['websocket'],
    forceNew: true,
    reconnection: false,
    query: { channel },
  });
  await new Promise((resolve, reject) => {
    socket.once('ready', resolve);
    socket.once('connect_error', reject);
  });
  return socket;
}

/**
 * Starts `pairs` relays and publishers and `streams` Socket.IO clients, each
 * on a channel of its own (stream i: relay and publisher i mod pairs).
 * `run(rate, seconds)` streams on every channel; `clients` are what a
 * `DeltaRecorder` attaches to.
 */
export async function startStreamFloor({ redisUrl, keyPrefix, pairs, streams }) {
  const script = fileURLToPath(import.meta.url);
  const children = [];
  const start = async (role, index) => {
    const child = fork(script, [role, redisUrl], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    children.push({ role, index, child });
    return { child, hello: await firstMessage(child) };
  };
  try {
    const relays = await Promise.all(Array.from({ length: pairs }, (_, i) => start('relay', i)));
    const publishers = await Promise.all(
      Array.from({ length: pairs }, (_, i) => start('publisher', i)),
    );
    const channels = Array.from({ length: streams }, (_, i) => `${keyPrefix}:floor:${i}`);
    const clients = await Promise.all(
      channels.map(async (channel, i) => {
        const socket = await connectToRelay(relays[i % pairs].hello.port, channel);
        return { socket };
      }),
    );
    return {
      clients,
      channels,
      meterTargets: () =>
        children.map(({ role, index, child }) => ({
          name: `${role === 'relay' ? 'gateway' : 'worker'}-floor-${index + 1}`,
          pid: child.pid,
        })),
      /** Streams `rate` deltas/s on the first `count` channels for `seconds`; resolves when sent. */
      async run(rate, seconds, count = streams) {
        await Promise.all(
          publishers.map(({ child }, p) => {
            const mine = channels.slice(0, count).filter((_, i) => i % pairs === p);
            const done = firstMessage(child);
            child.send({ channels: mine, rate, seconds });
            return done;
          }),
        );
        // The last deltas are on their way.
        await sleep(200);
      },
      close() {
        for (const client of clients) client.socket.close();
        for (const { child } of children) child.kill();
      },
    };
  } catch (error) {
    for (const { child } of children) child.kill();
    throw error;
  }
}

const [role, redisUrl] = process.argv.slice(2);
if (role === 'relay') await relay(redisUrl);
else if (role === 'publisher') await publisher(redisUrl);
