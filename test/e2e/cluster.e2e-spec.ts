// The cluster end to end, as clients and operators see it: real gateway and
// worker processes from dist/, on Postgres and Redis, with workers killed,
// paused and drained, Redis restarted and a gateway drained mid-conversation.
// Chat, limits, failover, drain and stop run with one conversation queue (the
// default) and with CONVERSATION_QUEUES=8.
import { Queue } from 'bullmq';
import { Redis, type Cluster } from 'ioredis';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import {
  ClusterKeys,
  conversationQueueIndex,
  conversationQueueNames,
  leaseTiming,
} from '@cs/cluster';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, devToken, ids, isAgentReply } from '../support/clients.js';
import { REFUSAL_ENV, refusalStoresNothing } from '../support/concurrency-refusal.js';
import { openFrozenSocket } from '../support/frozen-socket.js';
import { metricTotals } from '../support/metrics.js';
import {
  holderOf,
  readAllEvents,
  startCluster,
  until,
  workerHealth,
  type ClusterOptions,
  type TestCluster,
} from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { startPgBouncer, type PrivatePgBouncer } from '../support/pgbouncer.js';
import { startPrivateRedis, type PrivateRedis } from '../support/redis-server.js';
import { uniqueName } from '../support/services.js';
import { openTestRedis, useTestRedis } from '../support/test-redis.js';

const LEASE_TTL_MS = 3000;
/** `CONVERSATION_QUEUES` of the tests that run on both layouts: the default, and eight queues. */
const QUEUE_COUNTS = [1, 8] as const;
const queues = (count: number) => ({ CONVERSATION_QUEUES: String(count) });
/** What a bound measured from outside may exceed the contract's by (polling, scheduling). */
const SLACK_MS = 1000;

// One Redis, or a Redis Cluster with TEST_REDIS=cluster (npm run test:redis-cluster).
useTestRedis();

let cluster: TestCluster | undefined;
let redis: PrivateRedis | undefined;
let bouncer: PrivatePgBouncer | undefined;

async function cluster_(options: ClusterOptions): Promise<TestCluster> {
  cluster = await startCluster({
    ...options,
    env: { LEASE_TTL_MS: String(LEASE_TTL_MS), ...options.env },
  });
  const started = cluster;
  onTestFailed(() => {
    process.stderr.write(`\n===== process output of the failed test\n${started.outputs()}\n`);
  });
  return started;
}

afterEach(async () => {
  await cluster?.close();
  cluster = undefined;
  await redis?.stop();
  redis = undefined;
  await bouncer?.stop();
  bouncer = undefined;
});

async function createConversation(baseUrl: string, token: string): Promise<string> {
  const response = await api<{ conversation_id: string }>(baseUrl, 'POST', '/api/conversations', {
    token,
    body: {},
  });
  expect(response.status).toBe(201);
  return response.body.conversation_id;
}

/** Sends a user message through REST; resolves with its event id. */
async function sendMessage(
  baseUrl: string,
  token: string,
  conversationId: string,
  content: string,
): Promise<number> {
  const response = await api<{ event_id: number }>(
    baseUrl,
    'POST',
    `/api/conversations/${conversationId}/events`,
    { token, body: { action: 'message', args: { content } } },
  );
  expect(response.status, JSON.stringify(response.body)).toBe(201);
  return response.body.event_id;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function userMessages(events: readonly StoredEvent[]): StoredEvent[] {
  return events.filter((e) => e.source === 'user' && 'action' in e && e.action === 'message');
}

function contentOf(event: StoredEvent): string {
  return 'args' in event ? String(event.args.content) : '';
}

/** Waits until every user message of the conversation has an agent answer stored. */
async function waitForAnswers(
  baseUrl: string,
  token: string,
  conversationId: string,
  timeoutMs = 15_000,
): Promise<StoredEvent[]> {
  let events: StoredEvent[] = [];
  await until(
    async () => {
      events = await readAllEvents(baseUrl, token, conversationId);
      return userMessages(events).every((u) => events.some((e) => isAgentReply(e, u.id)));
    },
    'an answer to every user message',
    timeoutMs,
    100,
  );
  return events;
}

/** The contract's guarantees on a conversation's stored events. */
function expectExactlyOnce(events: readonly StoredEvent[], sentContents: readonly string[]): void {
  // Ids are the places 0, 1, 2, … without gaps.
  expect(events.map((e) => e.id)).toEqual(events.map((_, index) => index));
  // Every message sent is stored once.
  const stored = userMessages(events).map(contentOf);
  expect([...stored].sort()).toEqual([...sentContents].sort());
  // Every user message has exactly one agent answer, and every answer answers one.
  const users = userMessages(events);
  for (const user of users) {
    const answers = events.filter((e) => isAgentReply(e, user.id));
    expect(answers.length, `answers to event ${user.id} (${contentOf(user)})`).toBe(1);
    expect(contentOf(answers[0]!)).toContain(contentOf(user));
  }
  const agentMessages = events.filter(
    (e) => e.source === 'agent' && 'action' in e && e.action === 'message',
  );
  expect(agentMessages.length).toBe(users.length);
}

/**
 * The client has received every stored event of the conversation exactly once
 * and in id order (events stored meanwhile included: it keeps up with the store).
 */
async function expectEveryEventOnce(
  client: ConversationClient,
  baseUrl: string,
  token: string,
  conversationId: string,
): Promise<void> {
  let stored: StoredEvent[] = [];
  await until(
    async () => {
      stored = await readAllEvents(baseUrl, token, conversationId);
      return ids(client.events).includes(stored[stored.length - 1]!.id);
    },
    () => `the client to receive event ${stored[stored.length - 1]?.id}`,
    15_000,
    100,
  );
  await sleep(200); // anything sent twice would arrive by now
  const received = client.stored;
  expect(ids(received)).toEqual(received.map((_, index) => index));
  expect(received.slice(0, stored.length)).toEqual(stored);
}

function isReady(events: readonly unknown[]): boolean {
  return events.some(
    (e) =>
      typeof e === 'object' &&
      e !== null &&
      'observation' in e &&
      (e as StoredEvent & { extras: { agent_state?: string } }).extras.agent_state ===
        'awaiting_user_input',
  );
}

/** Lease epochs of the events a worker wrote, in id order. */
async function workerEpochs(c: TestCluster, conversationId: string): Promise<number[]> {
  const { rows } = await c.sql.query<{ lease_epoch: string }>(
    `SELECT lease_epoch FROM events
      WHERE conversation_id = $1 AND lease_epoch IS NOT NULL ORDER BY id`,
    [conversationId],
  );
  return rows.map((row) => Number(row.lease_epoch));
}

async function leaseOf(
  c: TestCluster,
  conversationId: string,
): Promise<{ epoch: number; owner: string | null }> {
  const { rows } = await c.sql.query<{ lease_epoch: string; lease_owner: string | null }>(
    'SELECT lease_epoch, lease_owner FROM conversations WHERE id = $1',
    [conversationId],
  );
  return { epoch: Number(rows[0]!.lease_epoch), owner: rows[0]!.lease_owner };
}

async function workerIdOf(worker: AppProcess): Promise<string> {
  const health = await workerHealth(worker);
  if (!health) throw new Error(`${worker.name} does not answer`);
  return health.worker_id;
}

/**
 * Resolves with the time from `since` until an agent answer written under a
 * lease epoch above `epoch` (a new holder's) is stored.
 */
async function firstAnswerFrom(
  c: TestCluster,
  conversationId: string,
  epoch: number,
  since: number,
): Promise<number> {
  await until(
    async () => {
      const { rows } = await c.sql.query(
        `SELECT 1 FROM events
          WHERE conversation_id = $1 AND source = 'agent' AND type = 'message' AND lease_epoch > $2
          LIMIT 1`,
        [conversationId, epoch],
      );
      return rows.length > 0;
    },
    'an answer from the new holder',
    30_000,
    25,
  );
  return Date.now() - since;
}

/**
 * Waits until the job lock of each conversation has been renewed, under the
 * token it holds now, for `spanMs` of lock time: its holder kept it that long
 * and no one else took it (a fixed sleep would pass as well on a machine too
 * busy to run the holder).
 */
async function keptThrough(
  c: TestCluster,
  openRedis: () => Redis | Cluster,
  conversationIds: readonly string[],
  spanMs: number,
  queueCount = 1,
): Promise<void> {
  const { lockRenewTime } = leaseTiming(LEASE_TTL_MS);
  const names = conversationQueueNames(queueCount);
  const lock = (id: string) =>
    `${c.prefix}:${names[conversationQueueIndex(id, queueCount)]}:conversation-${id}:lock`;
  const redis = openRedis();
  try {
    const tokens = await Promise.all(conversationIds.map((id) => redis.get(lock(id))));
    const ttls = await Promise.all(conversationIds.map((id) => redis.pttl(lock(id))));
    const renewals = conversationIds.map(() => 0);
    await until(
      async () => {
        for (const [n, id] of conversationIds.entries()) {
          const [token, ttl] = await Promise.all([redis.get(lock(id)), redis.pttl(lock(id))]);
          expect(token, `the job lock of ${id}`).toBe(tokens[n]);
          if (ttl > ttls[n]!) renewals[n]! += 1;
          ttls[n] = ttl;
        }
        return renewals.every((count) => count * lockRenewTime >= spanMs);
      },
      `the job locks renewed for ${spanMs} ms`,
      spanMs + 30_000,
      Math.floor(lockRenewTime / 4),
    );
  } finally {
    redis.disconnect();
  }
}

/** Clients on both gateways chat at once; each sees every stored event once, in order. */
async function chatAcrossGateways(c: TestCluster): Promise<void> {
  const [g1, g2] = c.gateways as [AppProcess, AppProcess];
  const token = await c.token('alice');
  const id = await createConversation(g1.url, token);
  const a = await ConversationClient.connect(g1.url, token, { conversation_id: id });
  const b = await ConversationClient.connect(g2.url, token, { conversation_id: id });
  try {
    await a.waitFor(isReady, 10_000, 'agent ready');
    // Both clients send at once, so that events of both gateways interleave.
    const sent = Array.from({ length: 20 }, (_, n) => `from ${n % 2 ? 'a' : 'b'} ${n}`);
    const acks = await Promise.all(sent.map((text, n) => (n % 2 ? a : b).message(text)));
    expect(acks.every((ack) => ack.ok)).toBe(true);
    expectExactlyOnce(await waitForAnswers(g1.url, token, id), sent);
    for (const client of [a, b]) await expectEveryEventOnce(client, g2.url, token, id);
  } finally {
    a.close();
    b.close();
  }
}

describe('cluster of gateways and workers', () => {
  it.each(QUEUE_COUNTS)(
    'delivers every stored event once and in order to clients on both gateways (%i queues)',
    async (queueCount) => {
      await chatAcrossGateways(
        await cluster_({ gateways: 2, workers: 2, env: queues(queueCount) }),
      );
    },
  );

  it('does the same through PgBouncer in transaction mode, with prepared statements off', async () => {
    bouncer = await startPgBouncer();
    const through = bouncer;
    await chatAcrossGateways(
      await cluster_({
        gateways: 2,
        workers: 2,
        databaseUrl: (direct) => through.urlFor(direct),
        env: { DATABASE_PREPARED_STATEMENTS: 'false', DATABASE_POOL_SIZE: '4' },
      }),
    );
  });

  it('streams live events over SSE from a gateway that has no other subscriber to the conversation', async () => {
    const c = await cluster_({ gateways: 2, workers: 2 });
    const [g1, g2] = c.gateways as [AppProcess, AppProcess];
    const token = await c.token('sse');
    const id = await createConversation(g1.url, token);
    const controller = new AbortController();
    const response = await fetch(`${g2.url}/api/conversations/${id}/stream`, {
      headers: { authorization: `Bearer ${token}` },
      signal: controller.signal,
    });
    expect(response.status).toBe(200);
    const reader = response.body!.getReader();
    let text = '';
    const reading = (async () => {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        text += new TextDecoder().decode(value);
      }
    })().catch(() => undefined);
    try {
      const sent = Array.from({ length: 10 }, (_, n) => `through g1 ${n}`);
      for (const content of sent) await sendMessage(g1.url, token, id, content);
      const stored = await waitForAnswers(g1.url, token, id);
      expectExactlyOnce(stored, sent);
      const last = stored[stored.length - 1]!.id;
      await until(async () => text.includes(`id: ${last}\n`), `event ${last} over SSE`, 10_000, 50);
      const streamed = [...text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]));
      expect(streamed).toEqual(stored.map((e) => e.id));
    } finally {
      controller.abort();
      await reading;
    }
  });

  it("counts a conversation's sockets on both gateways; a delete tells each of them once and closes it, on both", async () => {
    const c = await cluster_({ gateways: 2, workers: 1 });
    const [g1, g2] = c.gateways as [AppProcess, AppProcess];
    const token = await c.token('presence');
    const id = await createConversation(g1.url, token);
    const other = await createConversation(g1.url, token);
    const presence = (url: string, conversationId: string, as = token) =>
      api<{ sockets: number }>(url, 'GET', `/api/conversations/${conversationId}/presence`, {
        token: as,
      });
    const open = (url: string, conversationId: string) =>
      ConversationClient.connect(url, token, { conversation_id: conversationId, start: 'false' });
    const sockets = await Promise.all([g1, g1, g2, g2].map((g) => open(g.url, id)));
    const bystander = await open(g2.url, other);
    const controller = new AbortController();
    const response = await fetch(`${g1.url}/api/conversations/${id}/stream`, {
      headers: { authorization: `Bearer ${token}` },
      signal: controller.signal,
    });
    expect(response.status).toBe(200);
    let text = '';
    const reader = response.body!.getReader();
    const streamEnded = (async () => {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        text += new TextDecoder().decode(value);
      }
    })();
    try {
      await until(
        async () => (await presence(g1.url, id)).body.sockets === 4,
        'the four sockets counted',
      );
      for (const gateway of [g1, g2]) {
        expect(await presence(gateway.url, id)).toMatchObject({
          status: 200,
          body: { sockets: 4 },
        });
        expect((await presence(gateway.url, other)).body).toEqual({ sockets: 1 });
      }
      // Another user of the tenant, and the same user id in another tenant, find nothing.
      const stranger = await c.token('stranger');
      const foreign = await devToken(g1.url, {
        user_id: 'presence',
        tenant_id: uniqueName('elsewhere'),
      });
      for (const as of [stranger, foreign]) {
        expect((await presence(g2.url, id, as)).status).toBe(404);
      }
      sockets[3]!.close();
      await until(
        async () => (await presence(g1.url, id)).body.sockets === 3,
        'the closed socket of gateway 2 no longer counted',
      );

      // Deleted through gateway 2: the sockets of both gateways hear why, once, and close.
      expect((await api(g2.url, 'DELETE', `/api/conversations/${id}`, { token })).status).toBe(204);
      const attached = sockets.slice(0, 3);
      await until(
        () => attached.every((client) => client.socket.disconnected),
        'every socket of the deleted conversation closed',
      );
      for (const client of attached) {
        const notices = client.events.filter(
          (e) => 'status_update' in e && e.id === 'STATUS$CONVERSATION_DELETED',
        );
        expect(notices.length).toBe(1);
      }
      // The SSE stream closes too, after the same notice.
      await streamEnded;
      expect(text).toContain('STATUS$CONVERSATION_DELETED');
      for (const gateway of [g1, g2]) {
        expect((await presence(gateway.url, id)).status).toBe(404);
        expect((await presence(gateway.url, other)).body).toEqual({ sockets: 1 });
      }
      expect(bystander.socket.connected).toBe(true);
    } finally {
      for (const client of [...sockets, bystander]) client.close();
      controller.abort();
      await streamEnded.catch(() => undefined);
    }
  });

  it('counts actions through both gateways against one RATE_LIMIT_PER_MINUTE; repeats do not count', async () => {
    const limit = 5;
    const c = await cluster_({
      gateways: 2,
      workers: 1,
      env: { RATE_LIMIT_PER_MINUTE: String(limit) },
    });
    const [g1, g2] = c.gateways as [AppProcess, AppProcess];
    const token = await c.token('ivan');
    const id = await createConversation(g1.url, token);
    const redisClient = openTestRedis();
    const inWindow = () =>
      redisClient.zcard(new ClusterKeys(c.prefix).userActions(c.tenant, 'ivan'));
    const client = await ConversationClient.connect(g1.url, token, { conversation_id: id });
    const post = (gateway: AppProcess, content: string, key?: string) =>
      api<{ event_id?: number; error?: { code: string } }>(
        gateway.url,
        'POST',
        `/api/conversations/${id}/events`,
        {
          token,
          body: { action: 'message', args: { content } },
          ...(key === undefined ? {} : { headers: { 'idempotency-key': key } }),
        },
      );
    try {
      // The create counts too (docs/protocol.md), once the gateway counts it: the rest is left.
      const used = await inWindow();
      expect(used).toBeLessThanOrEqual(1);

      // The first action, then repeats of it through both gateways: stored once, counted once.
      const first = await client.message('first', 'key-first');
      expect(first.ok, JSON.stringify(first)).toBe(true);
      const firstId = first.ok ? first.event_id : -1;
      const restRepeat = await post(g2, 'first', 'key-first');
      expect([restRepeat.status, restRepeat.body.event_id]).toEqual([200, firstId]);
      expect(await client.message('first', 'key-first')).toEqual({ ok: true, event_id: firstId });
      expect(await inWindow()).toBe(used + 1);

      // The rest of the limit, alternately through g2 (REST) and g1 (socket).
      const sent = ['first'];
      const perGateway = { g1: 1, g2: 0 };
      for (let n = 0; used + sent.length < limit; n += 1) {
        const content = `within ${n}`;
        if (n % 2 === 0) {
          const response = await post(g2, content);
          expect(response.status, JSON.stringify(response.body)).toBe(201);
          perGateway.g2 += 1;
        } else {
          const ack = await client.message(content);
          expect(ack.ok, JSON.stringify(ack)).toBe(true);
          perGateway.g1 += 1;
        }
        sent.push(content);
      }
      // Each gateway took fewer than the limit: only a shared count refuses the next.
      expect(Math.max(perGateway.g1, perGateway.g2)).toBeLessThan(limit);

      // The next is refused on both gateways, over the socket and over REST.
      const refusedAck = await client.message('over the limit');
      expect(refusedAck).toMatchObject({ ok: false, error: { code: 'RATE_LIMITED' } });
      for (const gateway of [g1, g2]) {
        const refused = await post(gateway, 'over the limit');
        expect(refused.status).toBe(429);
        expect(refused.body.error?.code).toBe('RATE_LIMITED');
        // From the shared window: when its oldest action leaves it.
        const retryAfter = Number(refused.headers.get('retry-after'));
        expect(retryAfter).toBeGreaterThanOrEqual(1);
        expect(retryAfter).toBeLessThanOrEqual(60);
      }
      // A repeat is still answered, since it stores nothing.
      const lateRepeat = await post(g1, 'first', 'key-first');
      expect([lateRepeat.status, lateRepeat.body.event_id]).toEqual([200, firstId]);
      expect(await client.message('first', 'key-first')).toEqual({ ok: true, event_id: firstId });

      // Exactly the limit is in the window, and stored: refusals and repeats left no trace.
      expect(await inWindow()).toBe(limit);
      const stored = await waitForAnswers(g2.url, token, id);
      expect(userMessages(stored).map(contentOf)).toEqual(sent);
    } finally {
      client.close();
      redisClient.disconnect();
    }
  });

  it("stores nothing it refuses with CONCURRENCY_LIMIT_REACHED, counts none of it, and stores it once a slot frees; a create naming another user's running conversation leaves the slot free", async () => {
    const c = await cluster_({ gateways: 2, workers: 2, env: { ...REFUSAL_ENV } });
    const [g1, g2] = c.gateways.map((g) => g.url) as [string, string];
    await refusalStoresNothing([g1, g2], await c.token('full'));

    // Bob names Alice's running conversation in a create: 409, and his one slot stays his.
    const alice = await c.token('alice');
    const running = await api<{ conversation_id: string }>(g1, 'POST', '/api/conversations', {
      token: alice,
      body: { initial_user_msg: 'hello' },
    });
    expect(running.status).toBe(201);
    const taken = running.body.conversation_id;
    await waitForAnswers(g1, alice, taken);
    const bob = await c.token('bob');
    const named = await api<{ error?: { code: string } }>(g2, 'POST', '/api/conversations', {
      token: bob,
      body: { conversation_id: taken, initial_user_msg: 'mine' },
    });
    expect([named.status, named.body.error?.code]).toEqual([409, 'CONFLICT']);
    const own = await api<{ conversation_id: string }>(g1, 'POST', '/api/conversations', {
      token: bob,
      body: { initial_user_msg: 'mine' },
    });
    expect(own.status, JSON.stringify(own.body)).toBe(201);
    await waitForAnswers(g1, bob, own.body.conversation_id);
  });

  it.each([
    { policy: 'evict_oldest', queueCount: 1 },
    { policy: 'reject', queueCount: 1 },
    { policy: 'evict_oldest', queueCount: 8 },
  ] as const)(
    'leaves exactly MAX_CONCURRENT_CONVERSATIONS running after 50 concurrent starts ($policy, $queueCount queues)',
    async ({ policy, queueCount }) => {
      const limit = 3;
      const c = await cluster_({
        gateways: 2,
        workers: 2,
        env: {
          MAX_CONCURRENT_CONVERSATIONS: String(limit),
          CONCURRENCY_POLICY: policy,
          ...queues(queueCount),
        },
      });
      const gateways = c.gateways;
      const token = await c.token('bob');
      const conversations = await Promise.all(
        Array.from({ length: 50 }, (_, n) => createConversation(gateways[n % 2]!.url, token)),
      );
      const starts = await Promise.all(
        conversations.map((id, n) =>
          api<{ conversation_status?: string; error?: { code: string } }>(
            gateways[n % 2]!.url,
            'POST',
            `/api/conversations/${id}/start`,
            { token },
          ),
        ),
      );
      const accepted = conversations.filter((_, n) => starts[n]!.status === 200);
      // Each eviction or refusal is counted once, on the gateway that decided it.
      const counted = await metricTotals(
        gateways.map((g) => g.url),
        ['cs_limit_evictions_total', 'cs_limit_rejections_total'],
      );
      if (policy === 'reject') {
        expect(accepted.length).toBe(limit);
        for (const response of starts.filter((r) => r.status !== 200)) {
          expect(response.status).toBe(429);
          expect(response.body.error?.code).toBe('CONCURRENCY_LIMIT_REACHED');
        }
        expect(counted).toEqual({
          cs_limit_evictions_total: 0,
          cs_limit_rejections_total: starts.length - limit,
        });
      } else {
        expect(starts.map((r) => r.status)).toEqual(starts.map(() => 200));
        // Each start beyond the limit evicted one (one racing a finishing run may evict again).
        expect(counted.cs_limit_evictions_total).toBeGreaterThanOrEqual(
          conversations.length - limit,
        );
        expect(counted.cs_limit_rejections_total).toBe(0);
      }

      // Settled: nothing is starting, and the workers host exactly the RUNNING ones.
      const running = async () => {
        const list = await api<{ results: Array<{ conversation_id: string; status: string }> }>(
          gateways[0]!.url,
          'GET',
          '/api/conversations?limit=100',
          { token },
        );
        expect(list.status).toBe(200);
        expect(list.body.results.length).toBe(50);
        const statuses = list.body.results;
        const hosted = (await Promise.all(c.workers.map((w) => workerHealth(w)))).flatMap(
          (health) => health?.conversations ?? [],
        );
        return {
          starting: statuses.filter((r) => r.status === 'STARTING').length,
          running: statuses
            .filter((r) => r.status === 'RUNNING')
            .map((r) => r.conversation_id)
            .sort(),
          hosted: hosted.sort(),
        };
      };
      let settled = await running();
      await until(
        async () => {
          settled = await running();
          return (
            settled.starting === 0 &&
            JSON.stringify(settled.running) === JSON.stringify(settled.hosted)
          );
        },
        () => `statuses and workers to agree: ${JSON.stringify(settled)}`,
        20_000,
        200,
      );
      expect(settled.running.length).toBe(limit);
      if (policy === 'reject') expect(settled.running).toEqual([...accepted].sort());
      // And it stays so: no evicted conversation comes back, no slot leaks away,
      // while the holders keep their conversations for a lease's time.
      await keptThrough(c, openTestRedis, settled.running, LEASE_TTL_MS, queueCount);
      expect(await running()).toEqual(settled);

      if (policy === 'evict_oldest') {
        // Each evicted conversation says why it stopped (docs/protocol.md).
        const evicted = conversations.filter((id) => !settled.running.includes(id));
        for (const id of evicted) {
          const events = await readAllEvents(gateways[0]!.url, token, id);
          const stopped = events.filter(
            (e) =>
              'observation' in e &&
              e.extras.agent_state === 'stopped' &&
              e.extras.reason === 'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
          );
          expect(stopped.length, `stop notices of ${id}`).toBeGreaterThanOrEqual(1);
        }
      }
    },
  );

  it.each(
    [
      { clients: 'a client connected', connected: true },
      { clients: 'no client connected', connected: false },
    ].flatMap((clients) => QUEUE_COUNTS.map((queueCount) => ({ ...clients, queueCount }))),
  )(
    'answers every message exactly once when the holder is killed mid-stream ($clients, $queueCount queues)',
    async ({ connected, queueCount }) => {
      const c = await cluster_({ gateways: 1, workers: 2, env: queues(queueCount) });
      const gateway = c.gateways[0]!;
      const token = await c.token('carol');
      const id = await createConversation(gateway.url, token);
      const client = connected
        ? await ConversationClient.connect(gateway.url, token, { conversation_id: id })
        : undefined;
      try {
        if (!connected) {
          const start = await api(gateway.url, 'POST', `/api/conversations/${id}/start`, {
            token,
          });
          expect(start.status).toBe(200);
        }
        const holder = await holderOf(c.workers, id);
        const other = c.workers.find((w) => w !== holder)!;

        const sent: string[] = [];
        let killedAt = 0;
        let killedEpoch = 0;
        let firstAnswerAfterKill: Promise<number> | undefined;
        for (let n = 0; n < 30; n += 1) {
          if (n === 15) {
            killedEpoch = (await leaseOf(c, id)).epoch;
            killedAt = Date.now();
            holder.signal('SIGKILL');
            firstAnswerAfterKill = firstAnswerFrom(c, id, killedEpoch, killedAt);
          }
          const text = `message ${n}`;
          await sendMessage(gateway.url, token, id, text);
          sent.push(text);
          await sleep(30);
        }
        const failoverMs = await firstAnswerAfterKill!;
        process.stdout.write(
          `failover after SIGKILL (${connected ? 'with' : 'no'} client): ${failoverMs} ms\n`,
        );
        expect(failoverMs).toBeLessThanOrEqual(LEASE_TTL_MS + 2000 + SLACK_MS);

        const stored = await waitForAnswers(gateway.url, token, id);
        expectExactlyOnce(stored, sent);
        expect(await holderOf([other], id)).toBe(other);
        expect((await leaseOf(c, id)).owner).toBe(await workerIdOf(other));
        if (client) await expectEveryEventOnce(client, gateway.url, token, id);
      } finally {
        client?.close();
      }
    },
  );

  it("resumes a killed holder's conversation on a worker that starts after its slot lapsed", async () => {
    const c = await cluster_({ gateways: 1, workers: 1 });
    const gateway = c.gateways[0]!;
    const token = await c.token('heidi');
    const id = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, id, 'before the crash');
    await waitForAnswers(gateway.url, token, id);
    c.workers[0]!.signal('SIGKILL');
    await c.workers[0]!.exited;
    await sendMessage(gateway.url, token, id, 'while no worker runs');
    // No worker renews the slot: it lapses (2 × LEASE_TTL_MS), and the next
    // start of the same user sweeps it away.
    const slots = openTestRedis();
    try {
      const expiry = new ClusterKeys(c.prefix).userSlotExpiry(c.tenant, 'heidi');
      expect(Object.keys(await slots.hgetall(expiry))).toContain(id);
      // Lapsed by Redis' clock, the one the slot scripts read.
      await until(
        async () => {
          const [seconds, micros] = await slots.time();
          const now = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
          return Object.values(await slots.hgetall(expiry)).every((at) => Number(at) < now);
        },
        'the slot to lapse',
        2 * LEASE_TTL_MS + 10_000,
        100,
      );
    } finally {
      slots.disconnect();
    }
    const other = await createConversation(gateway.url, token);
    expect(
      (await api(gateway.url, 'POST', `/api/conversations/${other}/start`, { token })).status,
    ).toBe(200);

    const worker = await c.startWorker();
    const stored = await waitForAnswers(gateway.url, token, id);
    expectExactlyOnce(stored, ['before the crash', 'while no worker runs']);
    expect(await holderOf([worker], id)).toBe(worker);
  });

  it('fences out a holder paused past its lease (SIGSTOP, SIGCONT)', async () => {
    const c = await cluster_({ gateways: 1, workers: 2 });
    const gateway = c.gateways[0]!;
    const token = await c.token('dave');
    const id = await createConversation(gateway.url, token);
    const sent: string[] = [];
    const send = async (text: string) => {
      await sendMessage(gateway.url, token, id, text);
      sent.push(text);
    };
    await send('before the pause');
    const paused = await holderOf(c.workers, id);
    const other = c.workers.find((w) => w !== paused)!;
    await waitForAnswers(gateway.url, token, id);

    paused.signal('SIGSTOP');
    try {
      await send('while paused');
      // Answered by the other worker once the paused one's lease expired.
      await waitForAnswers(gateway.url, token, id, LEASE_TTL_MS + 10_000);
      expect((await workerHealth(other))?.conversations).toContain(id);
      expect((await leaseOf(c, id)).owner).toBe(await workerIdOf(other));
    } finally {
      paused.signal('SIGCONT');
    }
    const resumedAt = Date.now();
    // Messages right after the resume race with the stale holder's wake-ups.
    const more = (async () => {
      for (let n = 0; n < 10; n += 1) {
        await send(`after the resume ${n}`);
        await sleep(50);
      }
    })();
    await until(
      async () => {
        const health = await workerHealth(paused);
        return health !== null && !health.conversations.includes(id);
      },
      'the resumed worker to drop the conversation',
      LEASE_TTL_MS + 2000 + SLACK_MS,
      25,
    );
    const droppedMs = Date.now() - resumedAt;
    process.stdout.write(`resumed worker dropped the conversation after ${droppedMs} ms\n`);
    expect(droppedMs).toBeLessThanOrEqual(LEASE_TTL_MS + 2000 + SLACK_MS);
    await more;

    const stored = await waitForAnswers(gateway.url, token, id);
    await sleep(500); // a late write of the stale holder would be stored by now
    const final = await readAllEvents(gateway.url, token, id);
    expect(final).toEqual(stored);
    expectExactlyOnce(final, sent);
    const epochs = await workerEpochs(c, id);
    for (let n = 1; n < epochs.length; n += 1) {
      expect(epochs[n], `epoch of the ${n}th worker event`).toBeGreaterThanOrEqual(epochs[n - 1]!);
    }
    expect(new Set(epochs).size).toBeGreaterThan(1);
    expect((await workerHealth(other))?.conversations).toContain(id);
    expect((await workerHealth(paused))?.conversations).not.toContain(id);
  });

  it.each(QUEUE_COUNTS)(
    'hands conversations over on SIGTERM and exits, ignoring a second SIGTERM (%i queues)',
    async (queueCount) => {
      const c = await cluster_({ gateways: 1, workers: 2, env: queues(queueCount) });
      const gateway = c.gateways[0]!;
      const token = await c.token('erin');
      const id = await createConversation(gateway.url, token);
      const client = await ConversationClient.connect(gateway.url, token, { conversation_id: id });
      try {
        await client.waitFor(isReady, 10_000, 'agent ready');
        const first = await client.message('before the drain');
        await client.waitForReply(first.ok ? first.event_id : -1);
        const draining = await holderOf(c.workers, id);
        const other = c.workers.find((w) => w !== draining)!;

        const signalledAt = Date.now();
        draining.signal('SIGTERM');
        // As soon as it acts on the signal (not ready, or gone already).
        await until(
          async () =>
            (await fetch(`${draining.url}/readyz`).then(
              (r) => r.status,
              () => 'gone',
            )) !== 200,
          'the worker to start draining',
          5000,
          10,
        );
        // A supervisor repeating the signal while the drain runs must not cut it short.
        draining.signal('SIGTERM');
        const sentAt = Date.now();
        const eventId = await sendMessage(gateway.url, token, id, 'right after SIGTERM');
        await client.waitForReply(eventId, 10_000);
        const handOffMs = Date.now() - sentAt;
        process.stdout.write(`message after SIGTERM answered in ${handOffMs} ms\n`);
        expect(handOffMs).toBeLessThanOrEqual(2000 + SLACK_MS / 2);

        // The answer came from the other worker, under its lease.
        const lease = await leaseOf(c, id);
        expect(lease.owner).toBe(await workerIdOf(other));
        const { rows } = await c.sql.query<{ lease_epoch: string }>(
          `SELECT lease_epoch FROM events
          WHERE conversation_id = $1 AND source = 'agent' AND type = 'message' AND cause = $2`,
          [id, eventId],
        );
        expect(rows.map((row) => Number(row.lease_epoch))).toEqual([lease.epoch]);
        expect((await workerHealth(other))?.conversations).toContain(id);

        const code = await Promise.race([
          draining.exited,
          sleep(30_000).then(() => 'still running'),
        ]);
        const exitMs = Date.now() - signalledAt;
        process.stdout.write(`drained worker exited after ${exitMs} ms\n`);
        expect(code).toBe(0);
        expect(exitMs).toBeLessThanOrEqual(30_000);

        const more = await client.message('after the drain');
        await client.waitForReply(more.ok ? more.event_id : -1);
        expectExactlyOnce(await readAllEvents(gateway.url, token, id), [
          'before the drain',
          'right after SIGTERM',
          'after the drain',
        ]);
      } finally {
        client.close();
      }
    },
  );

  it.each(QUEUE_COUNTS)(
    'stops through one gateway a conversation held behind the other, and starts it again with the next message (%i queues)',
    async (queueCount) => {
      const c = await cluster_({ gateways: 2, workers: 2, env: queues(queueCount) });
      const [g1, g2] = c.gateways as [AppProcess, AppProcess];
      const token = await c.token('olga');
      const id = await createConversation(g1.url, token);
      await sendMessage(g1.url, token, id, 'before the stop');
      await waitForAnswers(g1.url, token, id);
      await holderOf(c.workers, id);

      const stopped = await api<{ conversation_status: string }>(
        g2.url,
        'POST',
        `/api/conversations/${id}/stop`,
        { token },
      );
      expect([stopped.status, stopped.body.conversation_status]).toEqual([200, 'STOPPED']);
      // Its job is gone from its queue and no worker lists it.
      const hosted = await Promise.all(c.workers.map((w) => workerHealth(w)));
      expect(hosted.flatMap((h) => h?.conversations ?? [])).not.toContain(id);
      const info = await api<{ status: string }>(g1.url, 'GET', `/api/conversations/${id}`, {
        token,
      });
      expect(info.body.status).toBe('STOPPED');

      await sendMessage(g2.url, token, id, 'after the stop');
      expectExactlyOnce(await waitForAnswers(g2.url, token, id), [
        'before the stop',
        'after the stop',
      ]);
      await holderOf(c.workers, id);
    },
  );

  it.each([
    { outage: 'a quick restart', downMs: 0, workers: 2, leaseMoves: false },
    // Long enough for the job's lock to lapse: BullMQ hands the job out again
    // once Redis is back, here necessarily to the worker that held it. A timed
    // outage: with Redis down, nothing shows when the lock would have lapsed.
    {
      outage: 'an outage longer than the lease',
      downMs: LEASE_TTL_MS + 1000,
      workers: 1,
      leaseMoves: true,
    },
  ])(
    'keeps a connected client whole across a Redis restart ($outage)',
    async ({ downMs, workers, leaseMoves }) => {
      const ownRedis = await startPrivateRedis();
      redis = ownRedis;
      const c = await cluster_({ gateways: 2, workers, redisUrl: ownRedis.url });
      const [g1, g2] = c.gateways as [AppProcess, AppProcess];
      const token = await c.token('frank');
      const id = await createConversation(g1.url, token);
      const client = await ConversationClient.connect(g1.url, token, { conversation_id: id });
      try {
        await client.waitFor(isReady, 10_000, 'agent ready');
        const sent: string[] = [];
        for (let n = 0; n < 3; n += 1) {
          const ack = await client.message(`before ${n}`);
          sent.push(`before ${n}`);
          await client.waitForReply(ack.ok ? ack.event_id : -1);
        }

        const epochBefore = (await leaseOf(c, id)).epoch;
        await ownRedis.restart(downMs);
        // Back when every process reaches Redis again.
        await until(
          async () => {
            const ready = await Promise.all(
              [...c.gateways, ...c.workers].map((p) =>
                fetch(`${p.url}/readyz`).then(
                  (r) => r.ok,
                  () => false,
                ),
              ),
            );
            return ready.every(Boolean);
          },
          'every process ready again',
          20_000,
          100,
        );
        expect(client.socket.connected).toBe(true);
        for (let n = 0; n < 5; n += 1) {
          const ack = await client.message(`after socket ${n}`);
          expect(ack.ok).toBe(true);
          sent.push(`after socket ${n}`);
          await sendMessage(g2.url, token, id, `after rest ${n}`);
          sent.push(`after rest ${n}`);
        }
        expectExactlyOnce(await waitForAnswers(g1.url, token, id, 20_000), sent);
        if (leaseMoves) {
          await until(
            async () => (await leaseOf(c, id)).epoch > epochBefore,
            'the lapsed lease to be taken again',
            10_000,
          );
        }
        // Settled once the current holder has started (written under the current epoch).
        await until(
          async () => (await workerEpochs(c, id)).at(-1) === (await leaseOf(c, id)).epoch,
          'the current holder to start',
          10_000,
        );
        // It goes on, hosted by one worker under the lease Postgres records.
        await sendMessage(g2.url, token, id, 'once settled');
        sent.push('once settled');
        await waitForAnswers(g1.url, token, id);
        const holder = await holderOf(c.workers, id);
        const lease = await leaseOf(c, id);
        expect(lease.owner).toBe(await workerIdOf(holder));
        // And it stays there: the job is not handed out again and again.
        await keptThrough(
          c,
          () => new Redis(ownRedis.url, { maxRetriesPerRequest: 1 }),
          [id],
          LEASE_TTL_MS + 1000,
        );
        expect(await leaseOf(c, id)).toEqual(lease);
        expect(await holderOf(c.workers, id)).toBe(holder);
        await expectEveryEventOnce(client, g1.url, token, id);
        expectExactlyOnce(await readAllEvents(g1.url, token, id), sent);

        // The queue works again too: a new conversation starts and answers.
        const fresh = await createConversation(g2.url, token);
        await sendMessage(g2.url, token, fresh, 'a new conversation');
        expectExactlyOnce(await waitForAnswers(g2.url, token, fresh), ['a new conversation']);
      } finally {
        client.close();
      }
    },
  );

  it('drains a gateway on SIGTERM; its clients resume on the other with no gap', async () => {
    const c = await cluster_({ gateways: 2, workers: 1 });
    const [g1, g2] = c.gateways as [AppProcess, AppProcess];
    const token = await c.token('grace');
    const id = await createConversation(g1.url, token);
    const leaving = await ConversationClient.connect(g1.url, token, { conversation_id: id });
    // A client of the other gateway, which must not notice anything.
    const staying = await ConversationClient.connect(g2.url, token, { conversation_id: id });
    const stayingDisconnects: string[] = [];
    staying.socket.on('disconnect', (reason) => stayingDisconnects.push(reason));
    let resumed: ConversationClient | undefined;
    try {
      await leaving.waitFor(isReady, 10_000, 'agent ready');
      const sent: string[] = [];
      for (let n = 0; n < 3; n += 1) {
        const ack = await leaving.message(`before ${n}`);
        sent.push(`before ${n}`);
        await leaving.waitForReply(ack.ok ? ack.event_id : -1);
      }
      const disconnected = new Promise<string>((resolve) =>
        leaving.socket.once('disconnect', (reason) => resolve(reason)),
      );

      const signalledAt = Date.now();
      g1.signal('SIGTERM');
      // Not ready from the signal on (503), until it is gone.
      let readiness: number | string = 200;
      await until(
        async () => {
          readiness = await fetch(`${g1.url}/readyz`).then(
            (r) => r.status,
            () => 'gone',
          );
          return readiness !== 200;
        },
        'the draining gateway to report not ready',
        5000,
        20,
      );
      expect([503, 'gone']).toContain(readiness);
      // Its sockets are closed (by the server, or with the process).
      const reason = await Promise.race([
        disconnected,
        sleep(10_000).then(() => 'still connected'),
      ]);
      expect(['io server disconnect', 'transport close']).toContain(reason);
      // Meanwhile the conversation goes on through the other gateway.
      for (let n = 0; n < 3; n += 1) {
        await sendMessage(g2.url, token, id, `while away ${n}`);
        sent.push(`while away ${n}`);
      }
      await waitForAnswers(g2.url, token, id);
      const code = await Promise.race([g1.exited, sleep(10_000).then(() => 'still running')]);
      expect(code).toBe(0);
      process.stdout.write(`gateway exited after ${Date.now() - signalledAt} ms\n`);
      // Only the draining gateway's sockets were closed.
      expect(stayingDisconnects).toEqual([]);

      const seen = ids(leaving.events);
      resumed = await ConversationClient.connect(g2.url, token, {
        conversation_id: id,
        latest_event_id: String(seen[seen.length - 1]),
      });
      const ack = await resumed.message('after the resume');
      sent.push('after the resume');
      await resumed.waitForReply(ack.ok ? ack.event_id : -1);
      const stored = await waitForAnswers(g2.url, token, id);
      expectExactlyOnce(stored, sent);
      const last = stored[stored.length - 1]!.id;
      for (const client of [resumed, staying]) {
        await client.waitFor((events) => ids(events).includes(last), 10_000, `event ${last}`);
      }
      await sleep(200);
      expect([...seen, ...ids(resumed.events)]).toEqual(stored.map((e) => e.id));
      expect(staying.socket.connected).toBe(true);
      expect(ids(staying.events)).toEqual(stored.map((e) => e.id));
    } finally {
      leaving.close();
      staying.close();
      resumed?.close();
    }
  });

  it('drains a gateway promptly although one of its socket clients stopped answering', async () => {
    const c = await cluster_({ gateways: 1, workers: 1 });
    const [gateway] = c.gateways as [AppProcess];
    const token = await c.token('frozen');
    const id = await createConversation(gateway.url, token);
    const frozen = await openFrozenSocket(gateway.url, token, { conversation_id: id });
    try {
      const signalledAt = Date.now();
      gateway.signal('SIGTERM');
      // Well within the drain's deadline (9 s), which it waited out for the frozen client.
      const code = await Promise.race([gateway.exited, sleep(8_000).then(() => 'still running')]);
      expect(code, gateway.output()).toBe(0);
      expect(Date.now() - signalledAt).toBeLessThan(4_000);
      expect(gateway.output()).not.toMatch(/drain timed out/);
    } finally {
      frozen.destroy();
    }
  });
});

describe('a cluster on eight conversation queues', () => {
  it('reports the waiting conversations per queue, gives every queue a consumer on each worker, and answers conversations of every queue from their own queue', async () => {
    const count = 8;
    const c = await cluster_({ gateways: 1, workers: 0, env: queues(count) });
    const gateway = c.gateways[0]!;
    const names = conversationQueueNames(count);
    // A user each: MAX_CONCURRENT_CONVERSATIONS (3) would evict most of one user's 16.
    const tokens = await Promise.all(Array.from({ length: 16 }, (_, n) => c.token(`quinn-${n}`)));
    const redisClient = openTestRedis();
    const queueOf = (id: string) =>
      new Queue(names[conversationQueueIndex(id, count)]!, {
        connection: redisClient,
        prefix: c.prefix,
      });
    try {
      // No worker yet: each conversation waits in the queue of its id.
      const ids: string[] = [];
      for (const token of tokens) {
        const id = await createConversation(gateway.url, token);
        await sendMessage(gateway.url, token, id, `to queue ${conversationQueueIndex(id, count)}`);
        ids.push(id);
      }
      const expected = names.map(
        (_, index) => ids.filter((id) => conversationQueueIndex(id, count) === index).length,
      );
      // 16 random ids fill at least four of the eight queues (all but certainly).
      expect(expected.filter((n) => n > 0).length).toBeGreaterThanOrEqual(4);
      let waiting: Array<number | undefined> = [];
      await until(
        async () => {
          waiting = waitingPerQueue(await (await fetch(`${gateway.url}/metrics`)).text(), count);
          return JSON.stringify(waiting) === JSON.stringify([ids.length, ...expected]);
        },
        () => `cs_conversations_waiting [total, per queue] ${JSON.stringify(waiting)}`,
      );

      // Two workers: each consumes every queue (BullMQ's registry of blocking connections).
      const workers = [await c.startWorker(), await c.startWorker()];
      for (const name of names) {
        const queue = new Queue(name, { connection: redisClient, prefix: c.prefix });
        try {
          let consumers = 0;
          await until(
            async () => (consumers = (await queue.getWorkers()).length) >= 2,
            () => `two consumers of ${name} (has ${consumers})`,
          );
        } finally {
          await queue.close();
        }
      }
      // What it costs (docs/design.md "Many queues"): the Redis connections of each worker.
      const clients = String(await redisClient.client('LIST'))
        .split('\n')
        .map((line) => /name=(\S*)/.exec(line)?.[1] ?? '');
      const own = (w: number) => clients.filter((name) => name.startsWith(`${c.prefix}-w${w}:`));
      const blocking = clients.filter((name) => name.startsWith(`${c.prefix}:`)).length;
      process.stdout.write(
        `connections on ${count} queues: worker 1 ${own(1).length}, worker 2 ${own(2).length}, blocking (both) ${blocking}\n`,
      );
      for (const [n, id] of ids.entries()) {
        expectExactlyOnce(await waitForAnswers(gateway.url, tokens[n]!, id), [
          `to queue ${conversationQueueIndex(id, count)}`,
        ]);
        const queue = queueOf(id);
        try {
          expect(await queue.getJobState(`conversation-${id}`)).toBe('active');
        } finally {
          await queue.close();
        }
      }
      await until(
        async () => {
          waiting = waitingPerQueue(
            await (await fetch(`${workers[0]!.url}/metrics`)).text(),
            count,
          );
          return waiting.every((n) => n === 0);
        },
        () => `no conversation waiting, on the worker: ${JSON.stringify(waiting)}`,
      );
    } finally {
      redisClient.disconnect();
    }
  });

  it('refuses to start a worker or a gateway given another queue count than the deployment uses, with one line naming CONVERSATION_QUEUES', async () => {
    const c = await cluster_({ gateways: 1, workers: 0, env: queues(8) });
    const { CONVERSATION_QUEUES: _eight, ...unset } = c.env;
    const attempts = [
      { app: 'worker', env: { ...c.env, ...queues(4), WORKER_ID: `${c.prefix}-w4` }, given: 4 },
      { app: 'gateway', env: unset, given: 1 },
    ] as const;
    for (const { app, env, given } of attempts) {
      const refusal = await startApp(app, env, { name: `${app} given ${given}` }).then(
        (started) => {
          started.signal('SIGKILL');
          return 'started';
        },
        (error: Error) => error.message,
      );
      expect(refusal).toMatch(/exited \(1\) before it was healthy/);
      const lines = refusal.split('\n').filter((line) => line.includes('CONVERSATION_QUEUES'));
      expect(lines, refusal).toHaveLength(1);
      expect(lines[0]).toContain(`uses 8 queues, this process was given ${given}`);
      expect(refusal).not.toMatch(/\n\s+at /);
    }
    // The deployment's own number still starts, and answers.
    await c.startWorker();
    const token = await c.token('rita');
    const id = await createConversation(c.gateways[0]!.url, token);
    await sendMessage(c.gateways[0]!.url, token, id, 'same count');
    expectExactlyOnce(await waitForAnswers(c.gateways[0]!.url, token, id), ['same count']);
  });
});

/** `cs_conversations_waiting` of one scrape: [the total, then each queue by index]. */
function waitingPerQueue(text: string, count: number): Array<number | undefined> {
  const values: Array<number | undefined> = Array.from({ length: count + 1 }, () => undefined);
  for (const line of text.split('\n')) {
    const match = /^cs_conversations_waiting(?:\{([^}]*)\})? (\S+)$/.exec(line);
    if (!match) continue;
    const queue = /queue="(\d+)"/.exec(match[1] ?? '')?.[1];
    values[queue === undefined ? 0 : Number(queue) + 1] = Number(match[2]);
  }
  return values;
}
