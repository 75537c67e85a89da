// @cs/client end to end: the SDK against the built standalone app and a
// two-gateway, two-worker cluster (real processes, a TCP proxy standing in for
// the network and the load balancer), and against a socket.io server of the
// test's own that sends scripted traffic (streamed deltas, token expiry).
import { rmSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { SignJWT } from 'jose';
import { Server as SocketIoServer, type Socket as ServerSocket } from 'socket.io';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  ConversationServiceError,
  createClient,
  isAgentMessage,
  type ConnectionState,
  type LiveConversation,
  type StoredEvent,
} from '@cs/client';
import { api } from '../support/clients.js';
import {
  CLUSTER_SECRET,
  readAllEvents,
  startCluster,
  until,
  type TestCluster,
} from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { standaloneDataDir } from '../support/migrated-template.js';

const STANDALONE_SECRET = 'client-sdk-e2e-secret-0123456789abcdef';

function signer(secret: string, tenant: string) {
  return (userId: string, exp: string | number = '1h') =>
    new SignJWT({ tid: tenant })
      .setProtectedHeader({ alg: 'HS256' })
      .setSubject(userId)
      .setIssuedAt()
      .setExpirationTime(exp)
      .sign(new TextEncoder().encode(secret));
}

interface Backend {
  /** The URL of a process, for the test's own requests (never through the proxy). */
  direct: string;
  /** The ports the proxy spreads connections over. */
  ports(): number[];
  sign(userId: string, exp?: string | number): Promise<string>;
  /** Kills the process listening on `port` (cluster: a gateway). */
  kill?(port: number): Promise<string>;
  close(): Promise<void>;
}

/**
 * The file's standalone app, started by the first describe that asks for it
 * and stopped after the file: each describe has a tenant of its own on it,
 * and none kills it.
 */
let standalone: Promise<{ app: AppProcess; dir: string }> | undefined;

afterAll(async () => {
  const started = await standalone?.catch(() => undefined);
  standalone = undefined;
  if (!started) return;
  await started.app.stop();
  rmSync(started.dir, { recursive: true, force: true });
});

async function standaloneBackend(): Promise<Backend> {
  standalone ??= (async () => {
    const dir = standaloneDataDir('cs-sdk-');
    const app = await startApp('standalone', {
      DATA_DIR: dir,
      AUTH_JWT_SECRET: STANDALONE_SECRET,
      RATE_LIMIT_PER_MINUTE: '0',
      MAX_CONCURRENT_CONVERSATIONS: '50',
    });
    return { app, dir };
  })();
  const { app } = await standalone;
  return {
    direct: app.url,
    ports: () => [app.port],
    sign: signer(STANDALONE_SECRET, uniqueName('tenant')),
    // Stopped after the file.
    close: async () => undefined,
  };
}

async function clusterBackend(): Promise<Backend> {
  const cluster: TestCluster = await startCluster({
    gateways: 2,
    workers: 2,
    env: { MAX_CONCURRENT_CONVERSATIONS: '50' },
  });
  const alive = () => cluster.gateways.filter((g) => g.child.exitCode === null && !g.child.killed);
  return {
    get direct() {
      return alive()[0]!.url;
    },
    ports: () => cluster.gateways.map((g) => g.port),
    sign: signer(CLUSTER_SECRET, cluster.tenant),
    async kill(port: number) {
      const gateway = cluster.gateways.find((g) => g.port === port)!;
      gateway.signal('SIGKILL');
      await gateway.exited;
      return gateway.name;
    },
    close: () => cluster.close(),
  };
}

async function createConversation(backend: Backend, token: string): Promise<string> {
  const response = await api<{ conversation_id: string }>(
    backend.direct,
    'POST',
    '/api/conversations',
    { token, body: { title: 'sdk' } },
  );
  expect(response.status).toBe(201);
  return response.body.conversation_id;
}

/** Sends `count` messages through REST, one after the other; `onSent(i)` after each. */
async function burst(
  backend: Backend,
  token: string,
  id: string,
  count: number,
  onSent: (index: number) => Promise<void> | void = () => undefined,
): Promise<void> {
  for (let i = 0; i < count; i += 1) {
    const response = await api(backend.direct, 'POST', `/api/conversations/${id}/events`, {
      token,
      body: { action: 'message', args: { content: `burst ${i}` } },
    });
    expect(response.status).toBe(201);
    await onSent(i);
  }
}

/** Every stored event once the echo agent has answered `replies` messages and settled. */
async function settledEvents(
  backend: Backend,
  token: string,
  id: string,
  replies: number,
): Promise<StoredEvent[]> {
  let events: StoredEvent[] = [];
  await until(
    async () => {
      events = await readAllEvents(backend.direct, token, id);
      const last = events.at(-1);
      return (
        events.filter((e) => isAgentMessage(e)).length === replies &&
        last !== undefined &&
        'observation' in last &&
        last.extras.agent_state === 'awaiting_user_input'
      );
    },
    () => `${replies} replies; have ${events.filter((e) => isAgentMessage(e)).length}`,
    60_000,
  );
  return events;
}

/** Records what a live conversation delivers, through `on('event')` and `events()`. */
function record(live: LiveConversation) {
  const received: number[] = [];
  const iterated: number[] = [];
  const states: ConnectionState[] = [];
  live.on('event', (event) => received.push(event.id));
  live.on('connection', (state) => states.push(state));
  const iterating = (async () => {
    for await (const event of live.events()) iterated.push(event.id);
  })();
  return { received, iterated, states, iterating };
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

const backends: Array<{ name: string; start: () => Promise<Backend> }> = [
  { name: 'the standalone app', start: standaloneBackend },
  { name: 'a two-gateway, two-worker cluster', start: clusterBackend },
];

describe.each(backends)('@cs/client against $name', ({ name, start }) => {
  let backend: Backend;
  let proxy: TcpProxy;
  const lives: LiveConversation[] = [];

  beforeAll(async () => {
    backend = await start();
    proxy = await TcpProxy.start(() => backend.ports());
  });

  afterEach(() => {
    for (const live of lives.splice(0)) live.close();
    proxy.refusing = false;
    proxy.mutedDownstream = false;
  });

  afterAll(async () => {
    await proxy?.close();
    await backend?.close();
  });

  async function open(user = 'alice') {
    const token = await backend.sign(user);
    const id = await createConversation(backend, token);
    const client = createClient({ url: proxy.url, token });
    const live = client.conversation(id);
    lives.push(live);
    return { token, id, client, live };
  }

  it('resumes after a forced disconnect in the middle of a burst: no gap, no duplicate', async () => {
    const { token, id, live } = await open();
    const seen = record(live);
    await live.connect();
    let cutAfter = -1;
    await burst(backend, token, id, 30, async (i) => {
      if (i !== 9) return;
      await until(() => seen.received.length > 0, 'events before the cut');
      cutAfter = live.lastEventId;
      proxy.cut();
    });
    const stored = await settledEvents(backend, token, id, 30);
    await until(() => live.lastEventId === stored.at(-1)!.id, 'the SDK caught up', 20_000);
    expect(cutAfter).toBeGreaterThanOrEqual(0);
    expect(cutAfter).toBeLessThan(stored.at(-1)!.id);
    expect(seen.received).toEqual(stored.map((e) => e.id));
    expect(seen.received).toEqual(range(stored.length));
    expect(seen.states).toEqual(expect.arrayContaining(['reconnecting', 'connected']));
    expect(live.connection).toBe('connected');
    expect(live.agentState).toBe('awaiting_user_input');
    live.close();
    await seen.iterating;
    expect(seen.iterated).toEqual(seen.received);
  });

  it('stores one event for a message sent while disconnected, and resolves it', async () => {
    const { token, id, live } = await open();
    const seen = record(live);
    await live.connect();
    proxy.refusing = true;
    proxy.cut();
    await until(() => live.connection === 'reconnecting', 'the SDK notices');
    let resolved = false;
    const sent = live.send('sent while away').then((result) => {
      resolved = true;
      return result;
    });
    // Not resolved while the SDK's attempts to reconnect are refused.
    const refusedBefore = proxy.refused;
    await until(() => proxy.refused >= refusedBefore + 2, 'two refused reconnections');
    expect(resolved).toBe(false);
    proxy.refusing = false;
    const { eventId } = await sent;
    const stored = await settledEvents(backend, token, id, 1);
    const mine = stored.filter((e) => 'action' in e && e.args.content === 'sent while away');
    expect(mine.map((e) => e.id)).toEqual([eventId]);
    await until(() => live.lastEventId === stored.at(-1)!.id, 'the SDK caught up');
    expect(seen.received).toEqual(range(stored.length));
  });

  it('resends an unacknowledged message with its client_event_id: the answer lost, one event stored', async () => {
    const { token, id, live } = await open();
    await live.connect();
    proxy.mutedDownstream = true; // the server stores it; its acknowledgement never arrives
    const clientEventId = randomUUID();
    const sent = live.send('answer lost', { clientEventId });
    let stored: StoredEvent[] = [];
    await until(async () => {
      stored = await readAllEvents(backend.direct, token, id);
      return stored.some((e) => 'action' in e && e.client_event_id === clientEventId);
    }, 'the message stored');
    proxy.cut();
    proxy.mutedDownstream = false;
    const { eventId } = await sent;
    const all = await settledEvents(backend, token, id, 1);
    const mine = all.filter((e) => 'action' in e && e.args.content === 'answer lost');
    expect(mine).toHaveLength(1);
    expect(mine[0]!.id).toBe(eventId);
    expect(mine[0]).toMatchObject({ client_event_id: clientEventId });
  });

  if (name.includes('cluster')) {
    it('resumes on the other gateway when the one it was on is killed in the middle of a burst', async () => {
      const { token, id, live } = await open();
      const seen = record(live);
      await live.connect();
      const [port] = proxy.targetsInUse();
      expect(port).toBeDefined();
      let killedAt = -1;
      // The burst goes to the gateway that survives, so that it goes on meanwhile.
      const survivor = backend.ports().find((p) => p !== port)!;
      const sender: Backend = { ...backend, direct: `http://127.0.0.1:${survivor}` };
      await burst(sender, token, id, 30, async (i) => {
        if (i !== 9) return;
        killedAt = live.lastEventId;
        await backend.kill!(port!);
      });
      const stored = await settledEvents(sender, token, id, 30);
      await until(() => live.lastEventId === stored.at(-1)!.id, 'the SDK caught up', 30_000);
      expect(killedAt).toBeLessThan(stored.at(-1)!.id);
      expect(proxy.targetsInUse()).toEqual([survivor]);
      expect(seen.received).toEqual(range(stored.length));
      expect(seen.states).toEqual(expect.arrayContaining(['reconnecting', 'connected']));
      live.close();
      await seen.iterating;
      expect(seen.iterated).toEqual(seen.received);
    });
  }
});

describe('@cs/client against the standalone app: tokens, pages, errors', () => {
  let backend: Backend;
  const lives: LiveConversation[] = [];

  beforeAll(async () => {
    backend = await standaloneBackend();
  });

  afterEach(() => {
    for (const live of lives.splice(0)) live.close();
  });

  afterAll(async () => {
    await backend?.close();
  });

  const longAgo = () => Math.floor(Date.now() / 1000) - 600;

  it('asks getToken again when the socket or a request is refused UNAUTHORIZED', async () => {
    const token = await backend.sign('bob');
    const id = await createConversation(backend, token);
    let calls = 0;
    const getToken = async () => {
      calls += 1;
      return backend.sign('bob');
    };
    const socketClient = createClient({ url: backend.direct, token: 'not-a-token', getToken });
    const live = socketClient.conversation(id);
    lives.push(live);
    await live.connect();
    expect(calls).toBe(1);
    expect(live.connection).toBe('connected');

    const restClient = createClient({
      url: backend.direct,
      token: await backend.sign('bob', longAgo()),
      getToken,
    });
    const info = await restClient.conversations.get(id);
    expect(info.conversation_id).toBe(id);
    expect(calls).toBe(2);
  });

  it('fails with ConversationServiceError UNAUTHORIZED when no good token comes', async () => {
    const token = await backend.sign('carol');
    const id = await createConversation(backend, token);
    const withoutRefresh = createClient({ url: backend.direct, token: 'not-a-token' });
    await expect(withoutRefresh.conversations.get(id)).rejects.toMatchObject({
      name: 'ConversationServiceError',
      code: 'UNAUTHORIZED',
      status: 401,
    });
    const live = withoutRefresh.conversation(id);
    lives.push(live);
    await expect(live.connect()).rejects.toBeInstanceOf(ConversationServiceError);
    expect(live.error?.code).toBe('UNAUTHORIZED');
    expect(live.connection).toBe('closed');

    let calls = 0;
    const stale = createClient({
      url: backend.direct,
      getToken: async () => {
        calls += 1;
        return backend.sign('carol', longAgo());
      },
    });
    const refused = stale.conversation(id);
    lives.push(refused);
    await expect(refused.connect()).rejects.toMatchObject({ code: 'UNAUTHORIZED' });
    expect(calls).toBe(2); // the first token, then one refresh
  });

  it('refreshes the token when the server closes the socket on its expiry, and goes on', async () => {
    const token = await backend.sign('dave');
    const id = await createConversation(backend, token);
    const fresh: string[] = [];
    const client = createClient({
      url: backend.direct,
      token: await backend.sign('dave', Math.floor(Date.now() / 1000) + 3),
      getToken: async () => {
        const next = await backend.sign('dave');
        fresh.push(next);
        return next;
      },
    });
    const live = client.conversation(id);
    lives.push(live);
    const statuses: string[] = [];
    live.on('status', (status) => statuses.push(status.id));
    const seen = record(live);
    await live.connect();
    // The server closes it at most 30 s (its clock tolerance) after `exp`.
    await until(() => statuses.includes('STATUS$TOKEN_EXPIRED'), 'STATUS$TOKEN_EXPIRED', 45_000);
    await until(() => live.connection === 'connected' && fresh.length === 1, 'reconnected');
    expect(seen.states).toEqual(expect.arrayContaining(['reconnecting', 'connected']));
    const { eventId } = await live.send('after the refresh');
    const stored = await settledEvents(backend, token, id, 1);
    expect(stored.some((e) => isAgentMessage(e) && e.cause === eventId)).toBe(true);
    await until(() => live.lastEventId === stored.at(-1)!.id, 'the SDK caught up');
    expect(seen.received).toEqual(range(stored.length));
  }, 90_000);

  it('walks every page of the list', async () => {
    const user = uniqueName('lister');
    const token = await backend.sign(user);
    let pages = 0;
    const client = createClient({
      url: backend.direct,
      token,
      fetch: (input, init) => {
        if (new URL(input).pathname === '/api/conversations' && init.method === 'GET') pages += 1;
        return fetch(input, init);
      },
    });
    const created: string[] = [];
    for (let i = 0; i < 23; i += 1) {
      created.push((await client.conversations.create({ title: `c${i}` })).conversation_id);
    }
    const listed: string[] = [];
    for await (const info of client.conversations.list({ limit: 5 })) {
      listed.push(info.conversation_id);
    }
    expect(listed).toHaveLength(23);
    expect(new Set(listed)).toEqual(new Set(created));
    expect(pages).toBe(5);
  });

  it('does what the REST half says: create, get, update, events, state, stop, delete', async () => {
    const token = await backend.sign('erin');
    const client = createClient({ url: backend.direct, token });
    const { conversation_id: id } = await client.conversations.create({
      title: 'rest',
      initial_user_msg: 'hello',
    });
    await until(async () => (await client.conversations.state(id)).last_event_id >= 3, 'answer');
    expect((await client.conversations.update(id, { title: 'renamed' })).title).toBe('renamed');
    expect((await client.conversations.get(id)).title).toBe('renamed');
    const latest = await client.conversations.events(id, { reverse: true, limit: 2 });
    expect(latest.events.map((e) => e.id)).toEqual([
      latest.events[0]!.id,
      latest.events[0]!.id - 1,
    ]);
    expect(latest.has_more).toBe(true);
    expect((await client.conversations.stop(id)).conversation_status).toBe('STOPPED');
    await client.conversations.delete(id);
    await expect(client.conversations.get(id)).rejects.toMatchObject({
      code: 'NOT_FOUND',
      status: 404,
    });
    const gone = client.conversation(id);
    lives.push(gone);
    await expect(gone.connect()).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('rejects a refused send with the code and field of the acknowledgement', async () => {
    const token = await backend.sign('frank');
    const id = await createConversation(backend, token);
    const live = createClient({ url: backend.direct, token }).conversation(id);
    lives.push(live);
    await live.connect();
    const refused = await live.send('x'.repeat(262_145)).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(ConversationServiceError);
    expect(refused).toMatchObject({ code: 'BAD_REQUEST', field: 'args.content' });
  });
});

/** A socket.io server of the test's own; `script` runs for each connection. */
async function scriptedServer(script: (socket: ServerSocket, index: number) => void): Promise<{
  url: string;
  handshakes: Array<{ query: Record<string, unknown>; token: unknown }>;
  close(): Promise<void>;
}> {
  const http = createHttpServer();
  const io = new SocketIoServer(http, { path: '/socket.io', transports: ['websocket'] });
  const handshakes: Array<{ query: Record<string, unknown>; token: unknown }> = [];
  io.on('connection', (socket) => {
    const index = handshakes.push({
      query: { ...socket.handshake.query },
      token: (socket.handshake.auth as { token?: unknown }).token,
    });
    script(socket, index - 1);
  });
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
  const address = http.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    handshakes,
    close: () => new Promise<void>((resolve) => io.close(() => resolve())),
  };
}

const at = '2026-12-01T00:00:00.000Z';
const userMessage = { id: 0, timestamp: at, source: 'user', action: 'message', message: '' };
const delta = (offset: number, text: string) => ({ stream: true, cause: 0, delta: text, offset });

describe('@cs/client against a scripted socket.io server', () => {
  it('assembles streamed text by offset when deltas arrive twice, late, and again after a reconnect', async () => {
    const server = await scriptedServer((socket, index) => {
      if (index === 0) {
        socket.emit('oh_event', { ...userMessage, args: { content: 'hi' } });
        for (const message of [
          delta(0, 'Hel'),
          delta(0, 'Hel'),
          delta(3, 'lo'),
          delta(3, 'lo'),
          delta(0, 'Hel'),
          delta(5, ' wor'),
          // shapes the SDK does not know: ignored or passed through, never a crash
          null,
          'text',
          { stream: true, cause: 'zero', delta: 'x' },
          { id: 'one' },
          {
            id: 1,
            timestamp: at,
            source: 'environment',
            observation: 'something_new',
            content: '',
            extras: {},
            message: '',
            novel: { kept: true },
          },
        ])
          socket.emit('oh_event', message);
        setTimeout(() => socket.disconnect(true), 200);
      } else {
        // The catch-up a late joiner gets (offset 0, the text so far), a repeat of a stored event, the rest.
        for (const message of [
          delta(0, 'Hello wor'),
          { ...userMessage, args: { content: 'hi' } },
          delta(9, 'ld'),
          delta(9, 'ld'),
          delta(5, ' wor'),
          {
            id: 2,
            timestamp: at,
            source: 'agent',
            cause: 0,
            action: 'message',
            args: { content: 'Hello world' },
            message: '',
          },
          delta(11, '!!'),
        ])
          socket.emit('oh_event', message);
      }
    });
    const live = createClient({ url: server.url, token: 't' }).conversation(randomUUID());
    try {
      const texts: string[] = [];
      live.on('delta', (update) => texts.push(update.text));
      const events: StoredEvent[] = [];
      live.on('event', (event) => events.push(event));
      await live.connect();
      await until(() => texts.length === 3, 'the first connection’s deltas');
      expect(live.streamingText(0)).toBe('Hello wor');
      await until(() => live.lastEventId === 2, 'the stored answer');
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(texts).toEqual(['Hel', 'Hello', 'Hello wor', 'Hello world']);
      expect(live.streamingText(0)).toBe('Hello world');
      expect(events.map((e) => e.id)).toEqual([0, 1, 2]);
      expect(events[1]).toMatchObject({ observation: 'something_new', novel: { kept: true } });
      expect(server.handshakes.map((h) => h.query.latest_event_id)).toEqual(['-1', '1']);
      expect(server.handshakes.map((h) => h.query.start)).toEqual(['true', 'false']);
    } finally {
      live.close();
      await server.close();
    }
  });

  it('asks getToken after STATUS$TOKEN_EXPIRED and reconnects with the new token', async () => {
    const server = await scriptedServer((socket, index) => {
      if (index === 0) {
        socket.emit('oh_event', { ...userMessage, args: { content: 'hi' } });
        socket.emit('oh_event', {
          status_update: true,
          type: 'error',
          id: 'STATUS$TOKEN_EXPIRED',
          message: 'the token expired',
        });
        socket.disconnect(true);
      }
    });
    let issued = 0;
    const live = createClient({
      url: server.url,
      token: 'first',
      getToken: () => `fresh-${++issued}`,
    }).conversation(randomUUID());
    try {
      await live.connect();
      await until(() => server.handshakes.length === 2 && live.connection === 'connected', 'back');
      expect(server.handshakes.map((h) => h.token)).toEqual(['first', 'fresh-1']);
      expect(server.handshakes[1]!.query.latest_event_id).toBe('0');
    } finally {
      live.close();
      await server.close();
    }
  });
});
