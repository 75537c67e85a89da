// Gateways and workers on a local Redis Cluster (3 masters, a replica each),
// whatever TEST_REDIS says: a start pointed at the wrong kind of Redis is
// refused with one line; a master killed (kill -9) or failed over (CLUSTER
// FAILOVER on its replica) under load loses and doubles nothing: every
// acknowledged message is stored once and answered once, event ids have no
// gap, and the clients' sockets get every event.
import { spawn } from 'node:child_process';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import calculateSlot from 'cluster-key-slot';
import { Redis } from 'ioredis';
import { ClusterKeys } from '@cs/cluster';
import { ConversationClient, api, ids, isAgentReply } from '../support/clients.js';
import { CLUSTER_SECRET, startCluster, until, type TestCluster } from '../support/cluster.js';
import { ROOT } from '../support/processes.js';
import { startRedisCluster, type LocalRedisCluster } from '../support/redis-cluster.js';
import { testDatabaseUrl, testRedisUrl } from '../support/services.js';

const LEASE_TTL_MS = 3000;

let redis: LocalRedisCluster;
let cluster: TestCluster | undefined;

beforeAll(async () => {
  redis = await startRedisCluster();
}, 60_000);

afterAll(async () => {
  await redis?.stop();
});

afterEach(async () => {
  await cluster?.close();
  cluster = undefined;
});

/** Starts an app that must refuse to start; resolves with its exit code and output. */
function refusedStart(
  app: 'gateway' | 'worker',
  env: Record<string, string>,
): Promise<{ code: number | string; lines: string[] }> {
  const child = spawn(process.execPath, [`dist/apps/${app}/src/main.js`], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: testDatabaseUrl(),
      AUTH_JWT_SECRET: CLUSTER_SECRET,
      PORT: '0',
      WORKER_HTTP_PORT: '0',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
  return new Promise((resolve) =>
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? signal ?? -1, lines: output.split('\n').filter(Boolean) });
    }),
  );
}

describe('a start pointed at the wrong Redis', () => {
  const cases: Array<[string, () => Record<string, string>, string, RegExp]> = [
    [
      'both REDIS_URL and REDIS_CLUSTER_URLS',
      () => ({ REDIS_URL: testRedisUrl(), REDIS_CLUSTER_URLS: redis.urls }),
      'REDIS_CLUSTER_URLS',
      /set either REDIS_URL or REDIS_CLUSTER_URLS, not both/,
    ],
    [
      'a seed list nobody answers',
      () => ({ REDIS_CLUSTER_URLS: 'redis://127.0.0.1:1,redis://127.0.0.1:2' }),
      'REDIS_CLUSTER_URLS',
      /none of the seed nodes answers/,
    ],
    [
      'REDIS_URL at a node of a Redis Cluster',
      () => ({ REDIS_URL: redis.nodes[0]!.url }),
      'REDIS_URL',
      /is a node of a Redis Cluster; set REDIS_CLUSTER_URLS/,
    ],
    [
      'REDIS_CLUSTER_URLS at a lone Redis',
      () => ({ REDIS_CLUSTER_URLS: testRedisUrl() }),
      'REDIS_CLUSTER_URLS',
      /is a lone Redis, not a node of a Redis Cluster/,
    ],
  ];

  it.each(cases)('refuses %s with one line naming the variable', async (_, env, variable, why) => {
    for (const app of ['gateway', 'worker'] as const) {
      const { code, lines } = await refusedStart(app, env());
      const naming = lines.filter((line) => line.includes(`${variable}:`));
      expect(code, `${app}:\n${lines.join('\n')}`).toBe(1);
      expect(naming, `${app}:\n${lines.join('\n')}`).toHaveLength(1);
      expect(naming[0]).toMatch(why);
      // No loop of connection errors before it.
      expect(lines.length, `${app}:\n${lines.join('\n')}`).toBeLessThanOrEqual(2);
    }
  });
});

interface Sent {
  conversation: string;
  content: string;
  eventId: number;
}

/**
 * Sends messages through both gateways, one conversation after another,
 * until `stop()`; a message refused (503, or no answer) is sent again with
 * its idempotency key until it is acknowledged.
 */
function sendUnderLoad(c: TestCluster, token: string, conversations: readonly string[]) {
  let running = true;
  const acknowledged: Sent[] = [];
  let refusals = 0;
  const loops = conversations.map(async (conversation, index) => {
    for (let n = 0; running; n++) {
      const content = `m${index}-${n}`;
      for (let attempt = 0; ; attempt++) {
        const gateway = c.gateways[(n + attempt) % c.gateways.length]!;
        const response = await api<{ event_id?: number }>(
          gateway.url,
          'POST',
          `/api/conversations/${conversation}/events`,
          {
            token,
            body: { action: 'message', args: { content } },
            headers: { 'idempotency-key': `${conversation}-${content}` },
          },
        ).catch(() => null);
        if (response?.status === 201 || response?.status === 200) {
          acknowledged.push({ conversation, content, eventId: response.body.event_id! });
          break;
        }
        // Anything but a refusal of an unreachable Redis is a failure of the test.
        if (response && response.status !== 503) {
          throw new Error(`${content}: ${response.status} ${JSON.stringify(response.body)}`);
        }
        refusals += 1;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  });
  return {
    acknowledged,
    refusals: () => refusals,
    async stop() {
      running = false;
      await Promise.all(loops);
    },
  };
}

/** Conversations whose keys fall on every master (three per master, by slot). */
async function conversationsOnEveryMaster(
  c: TestCluster,
  token: string,
): Promise<{ ids: string[]; onMaster: Map<number, string[]> }> {
  const masters = await redis.masters();
  const probe = new Redis(masters[0]!.url);
  try {
    const slots = (await probe.cluster('SLOTS')) as unknown as Array<
      [number, number, [string, number]]
    >;
    const masterOf = (slot: number) =>
      slots.find(([from, to]) => slot >= from && slot <= to)![2][1];
    const onMaster = new Map<number, string[]>();
    const keys = new ClusterKeys(c.prefix);
    const ids: string[] = [];
    while ([...onMaster.values()].filter((list) => list.length >= 2).length < masters.length) {
      const created = await api<{ conversation_id: string }>(
        c.gateways[0]!.url,
        'POST',
        '/api/conversations',
        {
          token,
          body: {},
        },
      );
      expect(created.status).toBe(201);
      const id = created.body.conversation_id;
      const port = masterOf(calculateSlot(keys.conversationChannel(id)));
      const list = onMaster.get(port) ?? [];
      if (list.length >= 2) continue;
      list.push(id);
      onMaster.set(port, list);
      ids.push(id);
    }
    return { ids, onMaster };
  } finally {
    probe.disconnect();
  }
}

/** Every acknowledged message stored once and answered once; ids 0..last with no gap. */
async function expectStoredOnceAnsweredOnce(
  c: TestCluster,
  conversations: readonly string[],
  acknowledged: readonly Sent[],
): Promise<void> {
  for (const conversation of conversations) {
    const mine = acknowledged.filter((sent) => sent.conversation === conversation);
    await until(
      async () => {
        const answered = await c.sql.query<{ n: string }>(
          `SELECT count(DISTINCT cause) AS n FROM events
            WHERE conversation_id = $1 AND source = 'agent' AND type = 'message'`,
          [conversation],
        );
        return Number(answered.rows[0]!.n) >= mine.length;
      },
      `answers to the ${mine.length} messages of ${conversation}`,
      60_000,
      200,
    );
    const rows = await c.sql.query<{
      id: number;
      source: string;
      type: string;
      cause: number | null;
      content: string | null;
    }>(
      `SELECT id::int AS id, source, type, cause::int AS cause, payload->'args'->>'content' AS content
         FROM events WHERE conversation_id = $1 ORDER BY id`,
      [conversation],
    );
    expect(rows.rows.map((row) => row.id)).toEqual(rows.rows.map((_, i) => i));
    const userMessages = rows.rows.filter((row) => row.source === 'user' && row.type === 'message');
    const contents = userMessages.map((row) => row.content);
    expect(new Set(contents).size, 'a user message stored twice').toBe(contents.length);
    for (const sent of mine) {
      const stored = userMessages.filter((row) => row.content === sent.content);
      expect(
        stored.map((row) => row.id),
        sent.content,
      ).toEqual([sent.eventId]);
      const answers = rows.rows.filter(
        (row) => row.source === 'agent' && row.type === 'message' && row.cause === sent.eventId,
      );
      expect(answers, `answers to ${sent.content}`).toHaveLength(1);
    }
  }
}

/** Each socket client got every stored event of its conversation, in order, once. */
async function expectClientsWhole(
  c: TestCluster,
  clients: ReadonlyMap<string, ConversationClient>,
): Promise<void> {
  for (const [conversation, client] of clients) {
    const last = await c.sql.query<{ id: number }>(
      'SELECT max(id)::int AS id FROM events WHERE conversation_id = $1',
      [conversation],
    );
    const lastId = Number(last.rows[0]!.id);
    await client.waitFor(
      (events) => ids(events).includes(lastId),
      30_000,
      `event ${lastId} of ${conversation}`,
    );
    expect(ids(client.events)).toEqual(Array.from({ length: lastId + 1 }, (_, i) => i));
  }
}

// The failover first: after it every master still has a replica, which the kill needs.
describe.each([
  ['CLUSTER FAILOVER on a replica', 'failover'],
  ['kill -9 of a master', 'kill'],
] as const)('%s under load', (_, fault) => {
  it('stores and answers every acknowledged message once, with no gap, and the clients resume', async () => {
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      redisClusterUrls: redis.urls,
      env: {
        LEASE_TTL_MS: String(LEASE_TTL_MS),
        MAX_CONCURRENT_CONVERSATIONS: '100',
        // The load sends one user's messages for as long as the fault takes
        // (a minute on a busy machine): far above the contract's 600 a minute.
        // The limiter stays on, so its keys go through the failover too.
        RATE_LIMIT_PER_MINUTE: '1000000',
      },
    });
    const c = cluster;
    onTestFailed(() => {
      process.stderr.write(`\n===== process output of the failed test\n${c.outputs()}\n`);
    });
    const token = await c.token('fault');
    const { ids: conversations, onMaster } = await conversationsOnEveryMaster(c, token);
    // A socket client per conversation, on alternate gateways, from its first event.
    const clients = new Map<string, ConversationClient>();
    for (const [i, id] of conversations.entries()) {
      clients.set(
        id,
        await ConversationClient.connect(c.gateways[i % 2]!.url, token, {
          conversation_id: id,
          latest_event_id: '-1',
        }),
      );
    }
    try {
      const load = sendUnderLoad(c, token, conversations);
      await until(
        () => load.acknowledged.length >= conversations.length * 3,
        'load under way',
        30_000,
      );

      const [victim] = await redis.masters();
      const [replica] = await redis.replicasOf(victim!.port);
      const victimConversations = onMaster.get(victim!.port) ?? [];
      expect(victimConversations.length).toBeGreaterThan(0);
      // Readiness, polled through the fault: a gateway says 503 while a master is gone.
      let failedOver = false;
      let sawNotReady = false;
      const readiness = (async () => {
        while (!failedOver) {
          const answer = await fetch(`${c.gateways[0]!.url}/readyz`).catch(() => null);
          if (answer?.status === 503) sawNotReady = true;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      })();
      if (fault === 'kill') {
        victim!.process.kill('SIGKILL');
      } else {
        const admin = new Redis(replica!.url);
        try {
          await admin.cluster('FAILOVER');
        } finally {
          admin.disconnect();
        }
      }
      // The replica took over, and every live node says so.
      await until(
        async () => (await redis.masters()).some((master) => master.port === replica!.port),
        `${replica!.port} master in place of ${victim!.port}`,
        30_000,
        100,
      );
      await redis.waitHealthy(30_000);
      failedOver = true;
      await readiness;
      if (fault === 'kill') expect(sawNotReady, 'readiness while the master was gone').toBe(true);
      for (const app of [...c.gateways, ...c.workers]) {
        await until(
          async () => (await fetch(`${app.url}/readyz`).catch(() => null))?.status === 200,
          `${app.name} ready after the failover`,
          30_000,
        );
      }
      // Keep sending after the failover, then let every conversation settle.
      const after = load.acknowledged.length;
      await until(
        () => load.acknowledged.length >= after + conversations.length * 3,
        'load after the failover',
        60_000,
      );
      await load.stop();

      await expectStoredOnceAnsweredOnce(c, conversations, load.acknowledged);
      await expectClientsWhole(c, clients);
      // The conversations of the failed master went on answering.
      for (const id of victimConversations) {
        const last = load.acknowledged.filter((sent) => sent.conversation === id).at(-1)!;
        expect(clients.get(id)!.events.some((e) => isAgentReply(e, last.eventId))).toBe(true);
      }
    } finally {
      for (const client of clients.values()) client.close();
    }
  });
});
