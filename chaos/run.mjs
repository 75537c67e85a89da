#!/usr/bin/env node
// `npm run chaos -- --duration <s> --seed <n>`: runs a local cluster (its own
// redis-server and database) under steady load while it injects faults at
// random (seeded, reproducible), then checks from Postgres and from what the
// clients received that nothing was lost, repeated, reordered or fenced out.
// Exits non-zero on any violation; the last line is a one-line summary.
//
// `npm run chaos -- --redis-cluster`: the same on a local Redis Cluster (3
// masters with a replica each, bench/lib/redis-cluster.mjs) with
// CONVERSATION_QUEUES=8, where the Redis faults are kill -9 of a master (its
// replica takes over; the killed node comes back as a replica) and
// `CLUSTER FAILOVER` of a master's replica, beside the same process faults.
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { io } from 'socket.io-client';
import { appProcess, freePort, redisServer, sleep } from './processes.mjs';
import { startRedisCluster } from '../bench/lib/redis-cluster.mjs';

const { values: options } = parseArgs({
  options: {
    duration: { type: 'string', default: '60' },
    seed: { type: 'string' },
    gateways: { type: 'string', default: '2' },
    workers: { type: 'string', default: '2' },
    users: { type: 'string', default: '3' },
    'conversations-per-user': { type: 'string', default: '4' },
    'lease-ttl': { type: 'string', default: '3000' },
    'redis-cluster': { type: 'boolean', default: false },
    verbose: { type: 'boolean', default: false },
    keep: { type: 'boolean', default: false },
  },
});

const durationMs = Number(options.duration) * 1000;
const seed =
  options.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(options.seed);
const gatewayCount = Number(options.gateways);
const workerCount = Number(options.workers);
const userCount = Number(options.users);
const perUser = Number(options['conversations-per-user']);
const leaseTtlMs = Number(options['lease-ttl']);
const limit = perUser; // every conversation may run: any excess is a violation
const onRedisCluster = options['redis-cluster'];
/** CONVERSATION_QUEUES on the Redis Cluster. */
const CLUSTER_QUEUES = 8;
for (const [name, value] of Object.entries({
  durationMs,
  seed,
  gatewayCount,
  workerCount,
  userCount,
  perUser,
  leaseTtlMs,
})) {
  if (!Number.isFinite(value) || value < 0) {
    console.error(`chaos: invalid --${name}`);
    process.exit(2);
  }
}

/** mulberry32: a small seeded generator, so that a run's faults can be replayed. */
function generator(state) {
  return () => {
    state |= 0;
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
/** Draws from one seeded stream of numbers. */
function dice(random) {
  return {
    between: (min, max) => min + Math.floor(random() * (max - min + 1)),
    pick: (items) => items[Math.floor(random() * items.length)],
  };
}
// The faults draw from a stream of their own: the clients draw whenever their
// traffic's timing has them draw, and must not shift which faults come.
const { between, pick } = dice(generator(seed));
const traffic = dice(generator(seed ^ 0x2545f491));

const started = Date.now();
const stamp = () => `${((Date.now() - started) / 1000).toFixed(1).padStart(6)}s`;
const say = (line) => console.log(`${stamp()} ${line}`);
const processLog = options.verbose ? (line) => console.log(`${stamp()} ${line}`) : undefined;
const violations = [];
const violate = (line) => {
  violations.push(line);
  say(`VIOLATION ${line}`);
};

const adminUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const database = `chaos_${Date.now().toString(36)}_${randomBytes(3).toString('hex')}`;
const databaseUrl = (() => {
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  return url.toString();
})();

const cleanups = [];
async function cleanup() {
  for (const step of cleanups.reverse()) await step().catch(() => undefined);
}
process.on('SIGINT', () => void cleanup().then(() => process.exit(130)));

async function main() {
  say(
    `seed ${seed}, ${durationMs / 1000} s, ${gatewayCount} gateways, ${workerCount} workers, ${userCount} users × ${perUser} conversations` +
      (onRedisCluster ? `, on a 3-master Redis Cluster with ${CLUSTER_QUEUES} queues` : ''),
  );
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE "${database}"`);
  cleanups.push(async () => {
    if (!options.keep) await admin.query(`DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`);
    await admin.end();
  });

  const redis = onRedisCluster ? null : await redisServer(processLog);
  const redisCluster = onRedisCluster ? await startRedisCluster() : null;
  cleanups.push(async () => {
    if (redisCluster) return redisCluster.stop();
    await redis.kill('SIGKILL');
    redis.cleanup();
  });
  const common = {
    DATABASE_URL: databaseUrl,
    ...(redisCluster
      ? {
          REDIS_URL: undefined,
          REDIS_CLUSTER_URLS: redisCluster.urls,
          CONVERSATION_QUEUES: String(CLUSTER_QUEUES),
        }
      : { REDIS_URL: redis.url }),
    KEY_PREFIX: 'chaos',
    AUTH_JWT_SECRET: 'chaos-secret-0123456789abcdef',
    AUTH_DEV_TOKENS: 'true',
    LEASE_TTL_MS: String(leaseTtlMs),
    MAX_CONCURRENT_CONVERSATIONS: String(limit),
    // Off: chaos checks delivery under faults, not quotas (the cluster e2e tests the limiter).
    RATE_LIMIT_PER_MINUTE: '0',
    IDLE_TIMEOUT_MS: '3600000',
    LOG_LEVEL: 'warn',
  };
  const gateways = [];
  for (let n = 0; n < gatewayCount; n++) {
    const port = await freePort();
    const gateway = appProcess(
      'gateway',
      `gateway-${n}`,
      { ...common, PORT: String(port) },
      port,
      processLog,
    );
    gateway.url = `http://127.0.0.1:${port}`;
    gateways.push(gateway);
  }
  const workers = [];
  for (let n = 0; n < workerCount; n++) {
    const port = await freePort();
    const worker = appProcess(
      'worker',
      `worker-${n}`,
      { ...common, WORKER_HTTP_PORT: String(port), WORKER_ID: `chaos-worker-${n}` },
      port,
      processLog,
    );
    worker.url = `http://127.0.0.1:${port}`;
    workers.push(worker);
  }
  cleanups.push(async () => Promise.all([...gateways, ...workers].map((p) => p.kill('SIGKILL'))));
  // The first process migrates; the others wait on the advisory lock.
  await gateways[0].start();
  await Promise.all([...gateways.slice(1), ...workers].map((p) => p.start()));
  say('cluster up');

  // ------------------------------------------------------------ conversations and clients
  const users = [];
  for (let n = 0; n < userCount; n++) {
    const response = await fetch(`${gateways[0].url}/api/dev/token`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ user_id: `user-${n}`, tenant_id: 'chaos' }),
    });
    users.push({ id: `user-${n}`, token: (await response.json()).token });
  }
  const conversations = [];
  for (const user of users) {
    for (let n = 0; n < perUser; n++) {
      const response = await fetch(
        `${gateways[conversations.length % gatewayCount].url}/api/conversations`,
        {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${user.token}` },
          body: JSON.stringify({ title: `chaos ${user.id} ${n}` }),
        },
      );
      const { conversation_id } = await response.json();
      conversations.push({
        id: conversation_id,
        user,
        gateway: gateways[conversations.length % gatewayCount],
      });
    }
  }
  const owner = new Map(conversations.map((c) => [c.id, c.user.id]));
  const clients = conversations.map((conversation) => new ChaosClient(conversation));
  cleanups.push(async () => clients.forEach((client) => client.close()));
  await Promise.all(clients.map((client) => client.connected));
  say(`${clients.length} clients connected`);

  // ------------------------------------------------------------ load, faults, sampling
  let running = true;
  const loops = clients.map((client) => client.loop(() => running));
  const sampler = (async () => {
    while (running) {
      const hosted = new Map();
      for (const worker of workers) {
        if (!worker.running) continue;
        try {
          const body = await (
            await fetch(`${worker.url}/healthz`, { signal: AbortSignal.timeout(1000) })
          ).json();
          for (const id of body.conversations) hosted.set(id, owner.get(id));
        } catch {
          // paused or restarting: its conversations are counted where they moved
        }
      }
      const perUserCount = new Map();
      for (const user of hosted.values()) perUserCount.set(user, (perUserCount.get(user) ?? 0) + 1);
      for (const [user, count] of perUserCount) {
        if (count > limit) violate(`${user} had ${count} running conversations (limit ${limit})`);
      }
      await sleep(500);
    }
  })();

  const faults = [];
  const redisRestart = () => [
    'restart Redis',
    async () => {
      say('fault: restart Redis');
      await redis.kill('SIGTERM');
      await sleep(between(100, 1000));
      await redis.start();
    },
  ];
  /** Nodes killed and not started again yet (all come back before the checks). */
  const downNodes = new Set();
  const redisClusterFaults = () => [
    [
      'kill -9 Redis master',
      async () => {
        const master = pick(await redisCluster.masters());
        say(`fault: kill -9 Redis master :${master.port}`);
        await redisCluster.kill(master);
        downNodes.add(master);
        // Its replica takes over after the node timeout; then the node comes back, as a replica.
        await redisCluster.waitHealthy(30_000);
        await sleep(between(200, 1500));
        await redisCluster.restart(master);
        downNodes.delete(master);
        await redisCluster.waitHealthy(30_000);
      },
    ],
    [
      'CLUSTER FAILOVER',
      async () => {
        const master = pick(await redisCluster.masters());
        const [replica] = await redisCluster.replicasOf(master.port);
        if (!replica)
          return say(`fault: CLUSTER FAILOVER skipped (:${master.port} has no replica)`);
        say(`fault: CLUSTER FAILOVER of :${master.port} to its replica :${replica.port}`);
        await redisCluster.failover(replica);
        await redisCluster.waitHealthy(30_000);
      },
    ],
  ];
  const faultKinds = [
    [
      'kill -9 worker',
      async () => {
        const worker = pick(workers);
        say(`fault: kill -9 ${worker.name}`);
        await worker.kill('SIGKILL');
        await sleep(between(300, 2500));
        await worker.start();
      },
    ],
    [
      'SIGTERM worker',
      async () => {
        const worker = pick(workers);
        say(`fault: SIGTERM ${worker.name}`);
        await worker.kill('SIGTERM');
        await worker.start();
      },
    ],
    [
      'SIGSTOP/SIGCONT worker',
      async () => {
        const worker = pick(workers);
        const pausedMs = leaseTtlMs + between(500, 2000);
        say(`fault: SIGSTOP ${worker.name} for ${pausedMs} ms`);
        worker.signal('SIGSTOP');
        await sleep(pausedMs);
        worker.signal('SIGCONT');
      },
    ],
    [
      'kill -9 gateway',
      async () => {
        const gateway = pick(gateways);
        say(`fault: kill -9 ${gateway.name}`);
        await gateway.kill('SIGKILL');
        await sleep(between(200, 1500));
        await gateway.start();
      },
    ],
    ...(redisCluster ? redisClusterFaults() : [redisRestart()]),
    [
      'terminate Postgres backends',
      async () => {
        const { rows } = await admin.query(
          'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
          [database],
        );
        say(`fault: pg_terminate_backend × ${rows.length}`);
      },
    ],
  ];
  const deadline = Date.now() + durationMs;
  while (Date.now() < deadline) {
    await sleep(between(1500, 4000));
    if (Date.now() >= deadline) break;
    const [name, inject] = pick(faultKinds);
    faults.push(name);
    try {
      await inject();
    } catch (error) {
      say(`fault ${name} failed to run: ${error.message}`);
    }
  }
  running = false;
  say('faults over; letting the cluster settle');
  for (const node of downNodes) await redisCluster.restart(node);
  await redisCluster?.waitHealthy(30_000);
  for (const proc of [...(redis ? [redis] : []), ...gateways, ...workers]) {
    if (!proc.running) await proc.start();
    else proc.signal('SIGCONT');
  }
  await Promise.all(loops);
  await sampler;

  // ------------------------------------------------------------ checks
  const db = new pg.Client({ connectionString: databaseUrl });
  await db.connect();
  cleanups.push(() => db.end());
  const acked = clients.flatMap((client) => client.acked);
  const settleDeadline = Date.now() + 60_000;
  for (;;) {
    const { rows } = await db.query(
      `SELECT count(*)::int AS unanswered FROM events u
        WHERE u.source = 'user' AND u.type = 'message'
          AND NOT EXISTS (SELECT 1 FROM events a WHERE a.conversation_id = u.conversation_id
                          AND a.source = 'agent' AND a.type = 'message' AND a.cause = u.id)`,
    );
    if (rows[0].unanswered === 0 || Date.now() > settleDeadline) break;
    await sleep(500);
  }

  for (const { conversationId, key, eventId } of acked) {
    const { rows } = await db.query(
      'SELECT id FROM events WHERE conversation_id = $1 AND client_event_id = $2',
      [conversationId, key],
    );
    if (rows.length !== 1 || Number(rows[0].id) !== eventId) {
      violate(
        `acked ${key} (${eventId}) is stored ${rows.length} times as ${rows.map((r) => r.id).join(',')}`,
      );
    }
  }
  const { rows: answers } = await db.query(
    `SELECT u.conversation_id, u.id, count(a.id)::int AS replies
       FROM events u LEFT JOIN events a
         ON a.conversation_id = u.conversation_id AND a.source = 'agent' AND a.type = 'message' AND a.cause = u.id
      WHERE u.source = 'user' AND u.type = 'message'
      GROUP BY u.conversation_id, u.id`,
  );
  for (const row of answers) {
    if (row.replies === 1) continue;
    // Where the conversation stands, for whoever looks into it.
    const { rows: states } = await db.query(
      `SELECT status, agent_state, answered_through::int AS answered_through, lease_epoch::int AS epoch
         FROM conversations WHERE id = $1`,
      [row.conversation_id],
    );
    violate(
      `user event ${row.conversation_id}#${row.id} has ${row.replies} replies` +
        ` (conversation: ${JSON.stringify(states[0] ?? null)})`,
    );
  }
  const { rows: shapes } = await db.query(
    'SELECT conversation_id, count(*)::int AS n, min(id)::int AS first, max(id)::int AS last FROM events GROUP BY conversation_id',
  );
  const lastIds = new Map();
  for (const row of shapes) {
    lastIds.set(row.conversation_id, row.last);
    if (row.first !== 0 || row.n !== row.last + 1)
      violate(`ids of ${row.conversation_id} have gaps`);
  }
  const { rows: epochs } = await db.query(
    `SELECT conversation_id, id, lease_epoch::int AS epoch FROM events
      WHERE lease_epoch IS NOT NULL ORDER BY conversation_id, id`,
  );
  let previous = { conversation_id: null, epoch: -1 };
  for (const row of epochs) {
    if (row.conversation_id === previous.conversation_id && row.epoch < previous.epoch) {
      violate(
        `event ${row.conversation_id}#${row.id} written with stale epoch ${row.epoch} after ${previous.epoch}`,
      );
    }
    previous = row;
  }
  // Each client must end with every stored event of its conversation, once, in order.
  const receiveDeadline = Date.now() + 30_000;
  while (
    Date.now() < receiveDeadline &&
    clients.some((c) => c.lastId !== (lastIds.get(c.conversation.id) ?? -1))
  ) {
    await sleep(200);
  }
  for (const client of clients) {
    const last = lastIds.get(client.conversation.id) ?? -1;
    const expected = Array.from({ length: last + 1 }, (_, n) => n);
    if (client.disorder.length > 0)
      violate(`client of ${client.conversation.id}: ${client.disorder[0]}`);
    if (JSON.stringify(client.received) !== JSON.stringify(expected)) {
      violate(
        `client of ${client.conversation.id} received ${client.received.length} of ${last + 1} events (last ${client.lastId})`,
      );
    }
  }

  const totalEvents = shapes.reduce((sum, row) => sum + row.n, 0);
  const verdict = violations.length === 0 ? 'PASS' : 'FAIL';
  const redisFaults = faults.filter((name) => /Redis|CLUSTER/.test(name)).length;
  console.log(
    `chaos: ${verdict} seed=${seed} duration=${durationMs / 1000}s${onRedisCluster ? ' redis=cluster' : ''}` +
      ` faults=${faults.length} redis_faults=${redisFaults} acked=${acked.length} events=${totalEvents}` +
      ` violations=${violations.length}`,
  );
  return violations.length === 0 ? 0 : 1;
}

/** One conversation's client: sends messages in a loop, resumes after every disconnect. */
class ChaosClient {
  constructor(conversation) {
    this.conversation = conversation;
    this.received = [];
    this.lastId = -1;
    this.disorder = [];
    this.acked = [];
    this.replies = new Set();
    this.socket = io(conversation.gateway.url, {
      transports: ['websocket'],
      auth: { token: conversation.user.token },
      query: { conversation_id: conversation.id, latest_event_id: '-1' },
      reconnectionDelay: 200,
      reconnectionDelayMax: 1000,
      forceNew: true,
    });
    this.socket.io.on('reconnect_attempt', () => {
      this.socket.io.opts.query.latest_event_id = String(this.lastId);
    });
    // A refused or dropped connection is retried for as long as the run lasts.
    this.socket.on('disconnect', (reason) => {
      if (reason === 'io server disconnect') setTimeout(() => this.reconnect(), 200);
    });
    this.socket.on('connect_error', () => {
      if (!this.socket.active) setTimeout(() => this.reconnect(), 500);
    });
    this.socket.on('oh_event', (event) => {
      if (typeof event.id !== 'number') return;
      if (event.id !== this.lastId + 1) {
        this.disorder.push(`expected id ${this.lastId + 1}, got ${event.id}`);
        if (event.id <= this.lastId) return;
      }
      this.received.push(event.id);
      this.lastId = event.id;
      if (event.source === 'agent' && event.action === 'message') this.replies.add(event.cause);
    });
    this.connected = new Promise((resolve) => this.socket.once('connect', resolve));
  }

  reconnect() {
    if (this.closed || this.socket.connected) return;
    this.socket.io.opts.query.latest_event_id = String(this.lastId);
    this.socket.connect();
  }

  async loop(running) {
    let n = 0;
    while (running()) {
      const key = `k-${this.conversation.id.slice(0, 8)}-${n}`;
      const content = `message ${n} of ${this.conversation.id}`;
      const eventId = await this.send(key, content, running);
      if (eventId !== null) {
        this.acked.push({ conversationId: this.conversation.id, key, eventId });
        const until = Date.now() + 20_000;
        while (!this.replies.has(eventId) && Date.now() < until && running()) await sleep(25);
      }
      n += 1;
      await sleep(traffic.between(50, 300));
    }
  }

  /** Sends until acknowledged (idempotent by key), or gives up when the run ends. */
  async send(key, content, running) {
    for (let attempt = 0; attempt < 60; attempt++) {
      if (this.socket.connected) {
        try {
          const ack = await this.socket.timeout(5000).emitWithAck('oh_user_action', {
            action: 'message',
            args: { content },
            client_event_id: key,
          });
          if (ack.ok) return ack.event_id;
        } catch {
          // no answer in time: send again under the same key
        }
      }
      if (!running() && attempt > 20) break;
      await sleep(300);
    }
    return null;
  }

  close() {
    this.closed = true;
    this.socket.close();
  }
}

main()
  .then(async (code) => {
    await cleanup();
    process.exit(code);
  })
  .catch(async (error) => {
    console.error(error);
    await cleanup();
    console.log(`chaos: ERROR seed=${seed} ${error.message}`);
    process.exit(1);
  });
