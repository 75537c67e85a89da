// The cluster end to end, as clients see it: chat, streams, presence and
// limits across two gateways and two workers, on several conversation queues;
// real processes from dist/ on Postgres and Redis (through PgBouncer:
// cluster-pgbouncer.e2e-spec.ts).
import { Queue } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { ClusterKeys, conversationQueueIndex, conversationQueueNames } from '@cs/cluster';
import { ConversationClient, api, devToken } from '../support/clients.js';
import { REFUSAL_ENV, refusalStoresNothing } from '../support/concurrency-refusal.js';
import { metricTotals } from '../support/metrics.js';
import {
  holderOf,
  readAllEvents,
  until,
  workerHealth,
  type ClusterOptions,
} from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { openTestRedis } from '../support/test-redis.js';
import {
  LEASE_TTL_MS,
  QUEUE_COUNTS,
  clusterPerTest,
  queues,
  chatAcrossGateways,
  contentOf,
  createConversation,
  expectExactlyOnce,
  keptThrough,
  sendMessage,
  userMessages,
  waitForAnswers,
} from '../support/cluster-conversations.js';

const fixture = clusterPerTest();
const cluster_ = (options: ClusterOptions) => fixture.start(options);
/**
 * Two gateways and two workers for the tests that only chat, stream, count
 * and stop: one cluster for them all, each under a tenant of its own (see
 * `ClusterPerTest.shared`).
 */
const sharedCluster = (queueCount = 1) =>
  fixture.shared({ gateways: 2, workers: 2, env: queues(queueCount) });

describe('cluster of gateways and workers', () => {
  it.each(QUEUE_COUNTS)(
    'delivers every stored event once and in order to clients on both gateways (%i queues)',
    async (queueCount) => {
      await chatAcrossGateways(await sharedCluster(queueCount));
    },
  );

  it('streams live events over SSE from a gateway that has no other subscriber to the conversation', async () => {
    const c = await sharedCluster();
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
    const c = await sharedCluster();
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
      // The create counts too (docs/protocol.md), once the gateway counts it: what is left is the rest.
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

  it.each(
    (['evict_oldest', 'reject'] as const).flatMap((policy) =>
      QUEUE_COUNTS.map((queueCount) => ({ policy, queueCount })),
    ),
  )(
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

  it.each(QUEUE_COUNTS)(
    'stops through one gateway a conversation held behind the other, and starts it again with the next message (%i queues)',
    async (queueCount) => {
      const c = await sharedCluster(queueCount);
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
