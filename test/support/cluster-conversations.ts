// What the cluster's end-to-end files share: the per-test cluster (stopped
// after each test, with its processes' output printed when a test fails), and
// conversations driven through it with the contract's checks on what is stored.
import type { Redis } from 'ioredis';
import { type Cluster } from 'ioredis';
import { afterAll, afterEach, expect, onTestFailed } from 'vitest';
import { conversationQueueIndex, conversationQueueNames, leaseTiming } from '@cs/cluster';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, devToken, ids, isAgentReply } from './clients.js';
import {
  readAllEvents,
  startCluster,
  until,
  workerHealth,
  type ClusterOptions,
  type TestCluster,
} from './cluster.js';
import { type AppProcess } from './processes.js';
import { type PrivatePgBouncer } from './pgbouncer.js';
import { type PrivateRedis } from './redis-server.js';
import { uniqueName } from './services.js';
import { testRedisKind, useTestRedis } from './test-redis.js';

export const LEASE_TTL_MS = 3000;
/**
 * `CONVERSATION_QUEUES` of the tests that run on both layouts: the default
 * on one Redis, eight queues on a Redis Cluster (each layout once per run:
 * the queue logic does not depend on where the queues live).
 */
export const QUEUE_COUNTS: readonly number[] = testRedisKind() === 'redis-cluster' ? [8] : [1];
export const queues = (count: number) => ({ CONVERSATION_QUEUES: String(count) });

/** The test's cluster, and a private Redis or PgBouncer it started; all stopped after each test. */
export interface ClusterPerTest {
  start(options: ClusterOptions): Promise<TestCluster>;
  /**
   * A cluster of these options shared by the file's tests that ask for the
   * same ones (started by the first, stopped after the file), for tests that
   * kill, pause or reconfigure nothing and need no empty database:
   * each gets it under a tenant of its own, so that they see none of each
   * other's conversations, limits or sockets. Not for a test that starts
   * workers (`startWorker`) or closes it.
   */
  shared(options: ClusterOptions): Promise<TestCluster>;
  redis: PrivateRedis | undefined;
  bouncer: PrivatePgBouncer | undefined;
}

/** Call once at the top of a file: a cluster per test, on the suite's Redis (see test-redis.ts). */
export function clusterPerTest(): ClusterPerTest {
  useTestRedis();
  let cluster: TestCluster | undefined;
  const shared = new Map<string, Promise<TestCluster>>();
  const withLease = (options: ClusterOptions): ClusterOptions => ({
    ...options,
    env: { LEASE_TTL_MS: String(LEASE_TTL_MS), ...options.env },
  });
  const printOnFailure = (started: TestCluster) =>
    onTestFailed(() => {
      process.stderr.write(`\n===== process output of the failed test\n${started.outputs()}\n`);
    });
  const fixture: ClusterPerTest = {
    redis: undefined,
    bouncer: undefined,
    async start(options) {
      cluster = await startCluster(withLease(options));
      const started = cluster;
      printOnFailure(started);
      return started;
    },
    async shared(options) {
      const key = JSON.stringify(options);
      let starting = shared.get(key);
      if (!starting) {
        starting = startCluster(withLease(options));
        shared.set(key, starting);
      }
      const started = await starting;
      printOnFailure(started);
      return ownTenantOf(started);
    },
  };
  afterAll(async () => {
    const started = await Promise.allSettled(shared.values());
    shared.clear();
    for (const result of started) if (result.status === 'fulfilled') await result.value.close();
  });
  afterEach(async () => {
    await cluster?.close();
    cluster = undefined;
    await fixture.redis?.stop();
    fixture.redis = undefined;
    await fixture.bouncer?.stop();
    fixture.bouncer = undefined;
  });
  return fixture;
}

/** The shared cluster as one test sees it: under a tenant of its own. */
function ownTenantOf(shared: TestCluster): TestCluster {
  const tenant = uniqueName('tenant');
  return {
    ...shared,
    tenant,
    token: (userId) => devToken(shared.gateways[0]!.url, { user_id: userId, tenant_id: tenant }),
    startWorker: () => Promise.reject(new Error('a shared cluster starts no worker for one test')),
    close: () => Promise.reject(new Error('a shared cluster is closed after the file')),
  };
}

export async function createConversation(baseUrl: string, token: string): Promise<string> {
  const response = await api<{ conversation_id: string }>(baseUrl, 'POST', '/api/conversations', {
    token,
    body: {},
  });
  expect(response.status).toBe(201);
  return response.body.conversation_id;
}

/** Sends a user message through REST; resolves with its event id. */
export async function sendMessage(
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

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export function userMessages(events: readonly StoredEvent[]): StoredEvent[] {
  return events.filter((e) => e.source === 'user' && 'action' in e && e.action === 'message');
}

export function contentOf(event: StoredEvent): string {
  return 'args' in event ? String(event.args.content) : '';
}

/** Waits until every user message of the conversation has an agent answer stored. */
export async function waitForAnswers(
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
export function expectExactlyOnce(
  events: readonly StoredEvent[],
  sentContents: readonly string[],
): void {
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
export async function expectEveryEventOnce(
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

export function isReady(events: readonly unknown[]): boolean {
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
export async function workerEpochs(c: TestCluster, conversationId: string): Promise<number[]> {
  const { rows } = await c.sql.query<{ lease_epoch: string }>(
    `SELECT lease_epoch FROM events
      WHERE conversation_id = $1 AND lease_epoch IS NOT NULL ORDER BY id`,
    [conversationId],
  );
  return rows.map((row) => Number(row.lease_epoch));
}

export async function leaseOf(
  c: TestCluster,
  conversationId: string,
): Promise<{ epoch: number; owner: string | null }> {
  const { rows } = await c.sql.query<{ lease_epoch: string; lease_owner: string | null }>(
    'SELECT lease_epoch, lease_owner FROM conversations WHERE id = $1',
    [conversationId],
  );
  return { epoch: Number(rows[0]!.lease_epoch), owner: rows[0]!.lease_owner };
}

export async function workerIdOf(worker: AppProcess): Promise<string> {
  const health = await workerHealth(worker);
  if (!health) throw new Error(`${worker.name} does not answer`);
  return health.worker_id;
}

/**
 * Resolves with the time from `since` until an agent answer written under a
 * lease epoch above `epoch` (a new holder's) is stored.
 */
export async function firstAnswerFrom(
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
export async function keptThrough(
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
export async function chatAcrossGateways(c: TestCluster): Promise<void> {
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
