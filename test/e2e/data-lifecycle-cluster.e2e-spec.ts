// The erasure of a user on a two-gateway, two-worker cluster (real processes,
// Postgres, Redis, BullMQ): with a socket open on each gateway and a turn
// running on a worker, everything of the user goes, and the test scans
// Postgres and Redis for anything left; a gateway killed (-9) while it runs an
// erasure leaves it to the other, which completes it. Then retention on such
// a cluster: idle conversations deleted once across it, a held one stopped
// and deleted with its sockets closed, an active one kept.
import { Cluster, type Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConversationClient, api, devToken, openSse } from '../support/clients.js';
import { AGENT_MODULE } from '../support/agent-runtime.js';
import { startCluster, until, workerHealth, type TestCluster } from '../support/cluster.js';
import { uniqueName } from '../support/services.js';
import { metricTotals } from '../support/metrics.js';
import { openTestRedis, useTestRedis } from '../support/test-redis.js';

useTestRedis();

/** Everything Redis holds under the deployment's prefix, as key → its contents as text. */
async function redisContents(prefix: string): Promise<Map<string, string>> {
  const client = openTestRedis();
  client.on('error', () => undefined);
  const contents = new Map<string, string>();
  try {
    const nodes: Redis[] =
      client instanceof Cluster
        ? (await new Promise((resolve) => client.once('ready', resolve)), client.nodes('master'))
        : [client];
    for (const node of nodes) {
      let cursor = '0';
      do {
        const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        cursor = next;
        for (const key of keys) {
          const type = await node.type(key);
          const value =
            type === 'string'
              ? await node.get(key)
              : type === 'hash'
                ? await node.hgetall(key)
                : type === 'zset'
                  ? await node.zrange(key, '0', '-1', 'WITHSCORES')
                  : type === 'set'
                    ? await node.smembers(key)
                    : type === 'list'
                      ? await node.lrange(key, 0, -1)
                      : type === 'stream'
                        ? await node.xrange(key, '-', '+')
                        : null;
          contents.set(key, `${type} ${JSON.stringify(value)}`);
        }
      } while (cursor !== '0');
    }
  } finally {
    client.disconnect();
  }
  return contents;
}

/** Rows of every table of the cluster's database whose text holds `needle`. */
async function postgresRowsHolding(cluster: TestCluster, needle: string): Promise<string[]> {
  const { rows: tables } = await cluster.sql.query<{ name: string }>(
    `SELECT quote_ident(table_name) AS name FROM information_schema.tables
      WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`,
  );
  const found: string[] = [];
  for (const { name } of tables) {
    const { rows } = await cluster.sql.query<{ row: string }>(
      `SELECT t::text AS row FROM ${name} t WHERE strpos(t::text, $1) > 0`,
      [needle],
    );
    found.push(...rows.map((row) => `${name}: ${row.row.slice(0, 200)}`));
  }
  return found;
}

describe('the erasure of a user on a cluster', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: { AGENT_MODULES: AGENT_MODULE, MAX_CONCURRENT_CONVERSATIONS: '100' },
    });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  const [first, second] = [0, 1];
  const gateway = (index: number) => cluster.gateways[index]!.url;

  async function erasureDone(via: string, token: string, id: string) {
    let last: { status: string; conversations_deleted: number } | undefined;
    await until(
      async () => {
        const answer = await api(via, 'GET', `/api/erasures/${id}`, { token });
        last = answer.status === 200 ? answer.body : undefined;
        return last?.status === 'done';
      },
      `erasure ${id} done`,
      40_000,
      200,
    );
    return last!;
  }

  it('stops and deletes everything of the user, closes its sockets on both gateways, and leaves nothing in Postgres or Redis', async () => {
    const user = uniqueName('zoe');
    const token = await cluster.token(user);
    const other = uniqueName('yan');
    const otherToken = await cluster.token(other);
    // A turn running on a worker: the waiter streams until it is stopped.
    const running = await api(gateway(first), 'POST', '/api/conversations', {
      token,
      body: { agent: 'waiter', initial_user_msg: 'wait for it' },
    });
    expect(running.status).toBe(201);
    const runningId = running.body.conversation_id as string;
    // A `user:` key, set by an agent's tool.
    const stateful = await api(gateway(second), 'POST', '/api/conversations', {
      token,
      body: {
        agent: 'tool_user',
        agent_config: { tool: 'set_state', arguments: { key: 'user:color', value: 'red' } },
        initial_user_msg: 'remember red',
      },
    });
    const statefulId = stateful.body.conversation_id as string;
    await until(async () => {
      const state = await api(gateway(first), 'GET', `/api/conversations/${statefulId}/state`, {
        token,
      });
      return state.body.state?.['user:color'] === 'red';
    }, 'the user: state');
    const kept = await api(gateway(first), 'POST', '/api/conversations', {
      token: otherToken,
      body: { initial_user_msg: 'mine stays' },
    });
    // A socket on each gateway.
    const onFirst = await ConversationClient.connect(gateway(first), token, {
      conversation_id: runningId,
      start: 'false',
    });
    const onSecond = await ConversationClient.connect(gateway(second), token, {
      conversation_id: statefulId,
      start: 'false',
    });
    await onFirst.waitFor((events) => events.some((event) => 'stream' in event), 10_000, 'a delta');
    const held = async () =>
      (await Promise.all(cluster.workers.map(workerHealth))).some((health) =>
        health?.conversations.includes(runningId),
      );
    expect(await held()).toBe(true);
    // The user's keys exist before (slots, rate limit).
    const before = [...(await redisContents(cluster.prefix)).keys()];
    expect(before.some((key) => key.includes(encodeURIComponent(user)))).toBe(true);

    const erased = await api(gateway(second), 'DELETE', '/api/users/me', { token });
    expect(erased.status).toBe(202);
    expect(await erasureDone(gateway(first), token, erased.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 2,
    });
    for (const socket of [onFirst, onSecond]) {
      await socket.waitFor(
        (events) =>
          events.some(
            (event) => 'status_update' in event && event.id === 'STATUS$CONVERSATION_DELETED',
          ),
        5_000,
        'the deletion notice',
      );
      await until(() => socket.socket.disconnected, 'the socket closed');
    }
    await until(async () => !(await held()), 'the worker let the running conversation go');

    // Nothing of the user in Postgres: no row holds its id nor one of its conversations'.
    for (const needle of [user, runningId, statefulId]) {
      expect(await postgresRowsHolding(cluster, needle), needle).toEqual([]);
    }
    // Nor in Redis. BullMQ's capped event log keeps the job ids it logged
    // (`conversation-<id>`: no user id, no content) until it trims them.
    const holdsUser = ([key, value]: [string, string]) =>
      key.includes(encodeURIComponent(user)) ||
      value.includes(user) ||
      [runningId, statefulId].some(
        (id) => key.includes(id) || (!key.endsWith(':events') && value.includes(id)),
      );
    let left: Array<[string, string]> = [];
    await until(
      async () => {
        left = [...(await redisContents(cluster.prefix))].filter(holdsUser);
        return left.length === 0;
      },
      () => `Redis to hold nothing of the user; left: ${JSON.stringify(left).slice(0, 2000)}`,
      10_000,
      200,
    );
    // The other user's conversation stays.
    expect(
      (
        await api(gateway(second), 'GET', `/api/conversations/${kept.body.conversation_id}`, {
          token: otherToken,
        })
      ).status,
    ).toBe(200);
    onFirst.close();
    onSecond.close();
  });

  it("closes an erased admin's sockets and streams on other users' conversations, on both gateways", async () => {
    const owner = uniqueName('olga');
    const ownerToken = await cluster.token(owner);
    const admin = uniqueName('root');
    const adminToken = await devToken(gateway(first), {
      user_id: admin,
      tenant_id: cluster.tenant,
      roles: ['admin'],
    });
    const created = await api(gateway(first), 'POST', '/api/conversations', {
      token: ownerToken,
      body: { initial_user_msg: 'watched' },
    });
    expect(created.status).toBe(201);
    const theirs = created.body.conversation_id as string;
    // The admin follows it on both gateways, by socket and by stream; so does its owner.
    const sockets = await Promise.all(
      [first, second].map((index) =>
        ConversationClient.connect(gateway(index), adminToken, {
          conversation_id: theirs,
          start: 'false',
        }),
      ),
    );
    const streams = await Promise.all(
      [first, second].map((index) => openSse(gateway(index), adminToken, theirs)),
    );
    const ownerStream = await openSse(gateway(first), ownerToken, theirs);
    const ended = new Set<string>();
    streams.forEach((stream, index) => void stream.ended.then(() => ended.add(`admin ${index}`)));
    void ownerStream.ended.then(() => ended.add('owner'));
    await until(
      () => [...streams, ownerStream].every((stream) => stream.text().includes('"id":0')),
      'the replays',
    );
    for (const socket of sockets) {
      await socket.waitFor((events) => events.some((event) => 'id' in event && event.id === 0));
    }

    // Asked of the second gateway, which runs it: the first hears of it through Redis.
    const erased = await api(gateway(second), 'DELETE', '/api/users/me', { token: adminToken });
    expect(erased.status).toBe(202);
    expect(await erasureDone(gateway(second), adminToken, erased.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 0,
    });
    await until(
      () => ended.has('admin 0') && ended.has('admin 1'),
      () => `the admin's streams ended (ended: ${[...ended].join(', ')})`,
    );
    for (const stream of streams) expect(stream.text()).toContain('STATUS$CONVERSATION_DELETED');
    for (const socket of sockets) {
      await until(() => socket.socket.disconnected, "the admin's socket closed");
    }
    // The owner's stream and conversation stay.
    expect(ended.has('owner')).toBe(false);
    expect(
      (await api(gateway(second), 'GET', `/api/conversations/${theirs}`, { token: ownerToken }))
        .status,
    ).toBe(200);
    ownerStream.abort();
    for (const socket of sockets) socket.close();
  });

  it('completes an erasure whose gateway was killed (-9) while it ran', async () => {
    const user = uniqueName('kim');
    const token = await cluster.token(user);
    const count = 60;
    for (let n = 0; n < count; n += 1) {
      const created = await api(gateway(second), 'POST', '/api/conversations', {
        token,
        body: { title: `c${n}` },
      });
      expect(created.status).toBe(201);
    }
    const erased = await api(gateway(first), 'DELETE', `/api/users/${user}`, { token });
    expect(erased.status).toBe(202);
    const killed = cluster.gateways[first]!;
    killed.signal('SIGKILL');
    await killed.exited;
    const { rows } = await cluster.sql.query<{
      status: string;
      conversations_deleted: number;
      lease_owner: string;
    }>('SELECT status, conversations_deleted, lease_owner FROM erasures WHERE id = $1', [
      erased.body.erasure_id,
    ]);
    // Killed midway: it ran there, and had deleted some of the conversations, not all.
    expect(rows[0]?.status).toBe('running');
    expect(rows[0]?.lease_owner).toContain(`-${killed.child.pid}-`);
    expect(rows[0]!.conversations_deleted).toBeLessThan(count);
    // The other gateway takes it over once the dead one's lease has expired.
    expect(await erasureDone(gateway(second), token, erased.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: count,
    });
    expect(
      (await api(gateway(second), 'GET', '/api/conversations', { token })).body.results,
    ).toEqual([]);
  });
});

/** A short retention: 0.00003 days, 2.592 s (the setup's sockets connect well within it). */
const RETENTION_DAYS = '0.00003';
const RETENTION_MS = 0.00003 * 86_400_000;

describe('retention on a cluster', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: {
        AGENT_MODULES: AGENT_MODULE,
        MAX_CONCURRENT_CONVERSATIONS: '100',
        RETENTION_DAYS,
        RETENTION_SWEEP_INTERVAL_MS: '200',
      },
    });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  const gateway = (index: number) => cluster.gateways[index]!.url;
  /** Every process of the cluster: each counts the deletions it made. */
  const processes = () => [...cluster.gateways, ...cluster.workers].map((proc) => proc.url);
  const deletedTotal = async () =>
    (await metricTotals(processes(), ['cs_retention_deleted_total'])).cs_retention_deleted_total;

  it('deletes each idle conversation once across the cluster, stops and deletes a held one closing its sockets on both gateways, and keeps an active one', async () => {
    const token = await cluster.token(uniqueName('rita'));
    const before = await deletedTotal();
    const gone = async (id: string) =>
      (await api(gateway(0), 'GET', `/api/conversations/${id}`, { token })).status === 404;
    const create = async (via: number, body: Record<string, unknown> = {}) => {
      const created = await api(gateway(via), 'POST', '/api/conversations', { token, body });
      expect(created.status).toBe(201);
      return created.body.conversation_id as string;
    };
    const idle = await Promise.all(Array.from({ length: 6 }, (_, n) => create(n % 2)));
    // Held by a worker: the waiter streams (storing nothing) until stopped.
    const held = await create(0, { agent: 'waiter', initial_user_msg: 'wait for it' });
    const active = await create(1);
    const activeCreatedAt = Date.now();
    // The active one gets a message every 300 ms, through either gateway.
    let n = 0;
    const keepAlive = setInterval(() => {
      n += 1;
      void api(gateway(n % 2), 'POST', `/api/conversations/${active}/events`, {
        token,
        body: { action: 'message', args: { content: `still here ${n}` } },
      });
    }, 300);
    const sockets = await Promise.all(
      [0, 1].flatMap((index) =>
        [held, idle[0]!].map((conversation_id) =>
          ConversationClient.connect(gateway(index), token, { conversation_id, start: 'false' }),
        ),
      ),
    );
    try {
      const holders = async () =>
        (await Promise.all(cluster.workers.map(workerHealth))).filter((health) =>
          health?.conversations.includes(held),
        ).length;
      await until(async () => (await holders()) === 1, 'a worker holding the waiter');
      await sockets[0]!.waitFor((events) => events.some((event) => 'stream' in event));

      await until(
        async () => (await Promise.all([...idle, held].map(gone))).every(Boolean),
        'the idle and the held conversations deleted',
        30_000,
        100,
      );
      for (const socket of sockets) {
        await socket.waitFor(
          (events) =>
            events.some(
              (event) => 'status_update' in event && event.id === 'STATUS$CONVERSATION_DELETED',
            ),
          5_000,
          'the deletion notice',
        );
        await until(() => socket.socket.disconnected, 'the socket closed');
      }
      await until(async () => (await holders()) === 0, 'the worker let the waiter go');
      // Twice its retention after it was made, the active one is still there.
      await until(
        () => Date.now() - activeCreatedAt > 2 * RETENTION_MS,
        'twice the retention',
        10_000,
      );
      expect(await gone(active)).toBe(false);
    } finally {
      clearInterval(keepAlive);
      for (const socket of sockets) socket.close();
    }
    // Left alone, it goes too.
    await until(() => gone(active), 'the conversation left alone deleted', 30_000, 100);
    // Each deletion counted once, by the one process whose sweep made it.
    const deleted = idle.length + 2;
    await until(async () => (await deletedTotal()) - before >= deleted, 'the deletions counted');
    expect((await deletedTotal()) - before).toBe(deleted);
    const { rows } = await cluster.sql.query<{ count: number }>(
      'SELECT count(*)::int AS count FROM conversations WHERE id = ANY($1::uuid[])',
      [[...idle, held, active]],
    );
    expect(rows[0]?.count).toBe(0);
  });
});
