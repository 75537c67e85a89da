// A throwaway local cluster for the benchmark: a fresh database and Redis key
// prefix, gateways and workers started from dist/, health-checked, and torn
// down again (also on errors and Ctrl-C).
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Redis } from 'ioredis';
import { freePort } from './ports.mjs';
import { processTable } from './proc.mjs';
import {
  conversationQueueIndex,
  conversationQueueNames,
} from '../../dist/libs/cluster/src/leases/conversation-queues.js';
import { conversationJobId } from '../../dist/libs/cluster/src/leases/conversation-jobs.js';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

const OUTPUT_KEPT_BYTES = 64 * 1024;
const HEALTH_TIMEOUT_MS = 60_000;
const WORKER_EXIT_TIMEOUT_MS = 35_000;
const GATEWAY_EXIT_TIMEOUT_MS = 12_000;
/** How the bench agent module's memory probe starts its line (bench/agents/bench-agents.mjs). */
const PROBE_MARKER = 'BENCH_MEMORY ';

/** Every child process started by any cluster, killed for sure when the bench exits. */
const allChildren = new Set();
process.on('exit', () => {
  for (const child of allChildren) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
});

export const defaultDatabaseUrl = () =>
  process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
export const defaultRedisUrl = () => process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function databaseUrlFor(baseUrl, database) {
  const url = new URL(baseUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

/** One gateway or worker process. */
class ServiceProcess {
  constructor(role, name, port, env, nodeArgs = []) {
    this.role = role;
    this.name = name;
    this.port = port;
    this.url = `http://127.0.0.1:${port}`;
    this.output = '';
    this.expectedExit = false;
    const fullEnv = { ...process.env, ...env };
    // `undefined`: unset (e.g. REDIS_URL of the caller's environment on a Redis Cluster).
    for (const [key, value] of Object.entries(fullEnv))
      if (value === undefined) delete fullEnv[key];
    this.child = spawn(process.execPath, [...nodeArgs, `dist/apps/${role}/src/main.js`], {
      cwd: ROOT,
      env: fullEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    allChildren.add(this.child);
    this.pid = this.child.pid;
    /** Answers of the memory probe (see `probeMemory`), oldest first. */
    this.memoryProbes = [];
    let partial = '';
    const probes = (text) => {
      if (!partial && !text.includes(PROBE_MARKER)) return;
      const lines = (partial + text).split('\n');
      partial = lines.pop() ?? '';
      for (const line of lines) {
        const at = line.indexOf(PROBE_MARKER);
        if (at >= 0) this.memoryProbes.push(JSON.parse(line.slice(at + PROBE_MARKER.length)));
      }
      if (!partial.includes(PROBE_MARKER)) partial = '';
    };
    const keep = (chunk) => {
      this.output += chunk.toString();
      if (this.output.length > OUTPUT_KEPT_BYTES)
        this.output = this.output.slice(-OUTPUT_KEPT_BYTES);
    };
    this.child.stdout.on('data', keep);
    this.child.stderr.on('data', (chunk) => {
      probes(chunk.toString());
      keep(chunk);
    });
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => {
        allChildren.delete(this.child);
        resolve({ code, signal, at: performance.now() });
      });
    });
    this.exitInfo = null;
    void this.exited.then((info) => {
      this.exitInfo = info;
      if (!this.expectedExit) {
        process.stderr.write(
          `\n[bench] ${this.name} exited unexpectedly (${info.code ?? info.signal}):\n${this.tail()}\n`,
        );
      }
    });
  }

  /**
   * Its memory after a forced full GC (bytes: rss, heapTotal, heapUsed,
   * external, arrayBuffers), from the bench agent module's probe (a process
   * started with BENCH_MEMORY_PROBE=1 answers SIGUSR2 on standard error).
   */
  async probeMemory(timeoutMs = 10_000) {
    const seen = this.memoryProbes.length;
    this.child.kill('SIGUSR2');
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.memoryProbes.length > seen) return this.memoryProbes[seen];
      await sleep(20);
    }
    throw new Error(`${this.name} did not answer the memory probe within ${timeoutMs} ms`);
  }

  get alive() {
    return this.exitInfo === null;
  }

  tail(lines = 30) {
    return this.output.split('\n').slice(-lines).join('\n');
  }

  signal(signal) {
    this.expectedExit = true;
    if (this.alive) this.child.kill(signal);
  }

  async waitHealthy(path, timeoutMs = HEALTH_TIMEOUT_MS) {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (!this.alive)
        throw new Error(`${this.name} exited before it was healthy:\n${this.tail()}`);
      try {
        const response = await fetch(this.url + path, { signal: AbortSignal.timeout(2000) });
        if (response.ok) return;
      } catch {
        // not listening yet
      }
      await sleep(100);
    }
    this.signal('SIGKILL');
    throw new Error(`${this.name} was not healthy within ${timeoutMs} ms:\n${this.tail()}`);
  }

  /** Sends `signal`, then SIGKILL after `timeoutMs`; resolves with the exit info. */
  async stop(signal = 'SIGTERM', timeoutMs = GATEWAY_EXIT_TIMEOUT_MS) {
    if (!this.alive) return this.exitInfo;
    this.signal(signal);
    const timer = setTimeout(() => this.signal('SIGKILL'), timeoutMs);
    const info = await this.exited;
    clearTimeout(timer);
    return info;
  }
}

export class Cluster {
  /**
   * @param {{ gateways: number, workers: number, leaseTtlMs: number,
   *   workerConcurrency: number, log: (line: string) => void, nodeArgs?: string[],
   *   env?: Record<string, string> }} options
   *   `nodeArgs`: extra flags for the service processes (e.g. `--cpu-prof`);
   *   `env`: more variables for every service process (e.g. `AGENT_MODULES`, `LLM_*`);
   *   `redisCluster`: a local Redis Cluster (bench/lib/redis-cluster.mjs) to run on
   *   instead of REDIS_URL, with `conversationQueues` queues (CONVERSATION_QUEUES);
   *   `redis`: a private redis-server ({ url, pid }) instead of the shared REDIS_URL
   */
  constructor(options) {
    this.options = options;
    this.stamp = `${new Date().toISOString().slice(0, 10).replaceAll('-', '')}_${randomBytes(4).toString('hex')}`;
    this.databaseName = `bench_${this.stamp}`;
    this.keyPrefix = `bench-${this.stamp}`;
    this.adminUrl = defaultDatabaseUrl();
    this.databaseUrl = databaseUrlFor(this.adminUrl, this.databaseName);
    /** The Redis Cluster this run is on, or null (one Redis: `redisUrl`). */
    this.redisCluster = options.redisCluster ?? null;
    this.conversationQueues = options.conversationQueues ?? 1;
    this.redisUrl = this.redisCluster ? null : (options.redis?.url ?? defaultRedisUrl());
    this.secret = randomBytes(32).toString('hex');
    this.gateways = [];
    this.workers = [];
    this.retired = [];
    this.databaseCreated = false;
    this.workerSerial = 0;
    /** A pool on the bench database for direct reads (and the building blocks' scratch table). */
    this.db = null;
  }

  get env() {
    return {
      DATABASE_URL: this.databaseUrl,
      ...(this.redisCluster
        ? { REDIS_URL: undefined, REDIS_CLUSTER_URLS: this.redisCluster.urls }
        : { REDIS_URL: this.redisUrl, REDIS_CLUSTER_URLS: undefined }),
      CONVERSATION_QUEUES: String(this.conversationQueues),
      KEY_PREFIX: this.keyPrefix,
      AUTH_JWT_SECRET: this.secret,
      AUTH_DEV_TOKENS: 'true',
      LEASE_TTL_MS: String(this.options.leaseTtlMs),
      MAX_CONCURRENT_CONVERSATIONS: '10000', // the configuration's maximum
      WORKER_CONCURRENCY: String(this.options.workerConcurrency),
      // Off: the bench measures throughput (1,000+ msg/s), not quotas; the cluster e2e tests the limiter.
      RATE_LIMIT_PER_MINUTE: '0',
      // The most the configuration takes: the memory probe opens 10,000 sockets of one user on one gateway.
      MAX_CONNECTIONS_PER_USER: '100000',
      LOG_LEVEL: 'warn',
      HOST: '127.0.0.1',
      ...this.options.env,
    };
  }

  async createDatabase() {
    const admin = new pg.Client({ connectionString: this.adminUrl });
    await admin.connect();
    try {
      await admin.query(`CREATE DATABASE "${this.databaseName}"`);
      this.databaseCreated = true;
    } finally {
      await admin.end();
    }
    this.db = new pg.Pool({ connectionString: this.databaseUrl, max: 4 });
    this.db.on('error', () => undefined);
  }

  async start() {
    const { gateways, workers } = this.options;
    this.options.log(
      `database ${this.databaseName}, key prefix ${this.keyPrefix}: starting ${gateways} gateway(s) and ${workers} worker(s)`,
    );
    await this.createDatabase();
    // The first gateway applies the migrations; the rest start together.
    const first = await this.startGateway();
    await Promise.all([
      ...Array.from({ length: gateways - 1 }, () => this.startGateway()),
      ...Array.from({ length: workers }, () => this.startWorker()),
    ]);
    return first;
  }

  async startGateway() {
    const port = await freePort();
    const proc = new ServiceProcess(
      'gateway',
      `gateway-${this.gateways.length + 1}`,
      port,
      { ...this.env, PORT: String(port) },
      this.options.nodeArgs,
    );
    this.gateways.push(proc);
    await proc.waitHealthy('/readyz');
    return proc;
  }

  /** @param env more variables for this worker only (e.g. BENCH_MEMORY_PROBE) */
  async startWorker(env = {}) {
    const port = await freePort();
    this.workerSerial += 1;
    const name = `worker-${this.workerSerial}`;
    const proc = new ServiceProcess(
      'worker',
      name,
      port,
      {
        ...this.env,
        WORKER_HTTP_PORT: String(port),
        WORKER_ID: `${this.keyPrefix}-${name}`,
        PORT: String(await freePort()),
        ...env,
      },
      this.options.nodeArgs,
    );
    this.workers.push(proc);
    await proc.waitHealthy('/readyz');
    return proc;
  }

  /** Stops a worker (SIGTERM: hand-off; SIGKILL: crash) and drops it from the live set. */
  async stopWorker(worker, signal) {
    this.workers = this.workers.filter((w) => w !== worker);
    this.retired.push(worker);
    if (signal === 'SIGKILL') {
      worker.signal('SIGKILL');
      return worker.exited;
    }
    return worker.stop(signal, WORKER_EXIT_TIMEOUT_MS);
  }

  /** Stops a gateway (SIGTERM: its drain) and drops it from the live set. */
  async stopGateway(gateway) {
    this.gateways = this.gateways.filter((g) => g !== gateway);
    this.retired.push(gateway);
    return gateway.stop('SIGTERM');
  }

  /** Live service processes, for CPU and memory meters. */
  processes() {
    return [...this.gateways, ...this.workers].filter((p) => p.alive);
  }

  /**
   * What the CPU meter watches: the service processes by name, this run's
   * Postgres backends (their process title names the database) as
   * `postgres`, and the Redis server as `redis` (the shared one: with other
   * users' work; a private one or the Redis Cluster's nodes: this run's only).
   */
  meterTargets() {
    const targets = this.processes().map((p) => ({ name: p.name, pid: p.pid }));
    const redisPids = this.redisCluster
      ? this.redisCluster.pids()
      : this.options.redis
        ? [this.options.redis.pid]
        : null;
    for (const pid of redisPids ?? []) targets.push({ name: 'redis', pid });
    for (const row of processTable()) {
      if (row.cmdline.startsWith('postgres: ') && row.cmdline.includes(` ${this.databaseName} `)) {
        targets.push({ name: 'postgres', pid: row.pid });
      } else if (redisPids === null && row.comm === 'redis-server') {
        targets.push({ name: 'redis', pid: row.pid });
      }
    }
    return targets;
  }

  /** A client of this run's Redis (one node, or the cluster); `disconnect()` it after use. */
  redisClient() {
    const options = { maxRetriesPerRequest: 1 };
    if (!this.redisCluster) return new Redis(this.redisUrl, options);
    return new Redis.Cluster(
      this.redisCluster.nodes.map((node) => ({ host: '127.0.0.1', port: node.port })),
      { redisOptions: options },
    );
  }

  /** The Redis key of a conversation's BullMQ job (its queue follows from its id). */
  conversationJobKey(conversationId) {
    const queue = conversationQueueNames(this.conversationQueues)[
      conversationQueueIndex(conversationId, this.conversationQueues)
    ];
    return `${this.keyPrefix}:${queue}:${conversationJobId(conversationId)}`;
  }

  /** Worker name → ids of the conversations it hosts (its `/healthz`). */
  async holdings() {
    const result = new Map();
    await Promise.all(
      this.workers.map(async (worker) => {
        try {
          const response = await fetch(`${worker.url}/healthz`, {
            signal: AbortSignal.timeout(5000),
          });
          const body = await response.json();
          result.set(worker, new Set(body.conversations ?? []));
        } catch {
          result.set(worker, new Set());
        }
      }),
    );
    return result;
  }

  /** Stops every process, drops the database (unless `keep`) and the Redis keys. */
  async destroy({ keep = false } = {}) {
    const live = [...this.gateways, ...this.workers, ...this.retired].filter((p) => p.alive);
    await Promise.all(
      live.map((p) =>
        p.stop('SIGTERM', p.role === 'worker' ? WORKER_EXIT_TIMEOUT_MS : GATEWAY_EXIT_TIMEOUT_MS),
      ),
    );
    await this.db?.end().catch(() => undefined);
    this.db = null;
    if (keep) {
      this.options.log(`kept database ${this.databaseName} and Redis keys ${this.keyPrefix}:*`);
      return;
    }
    if (this.databaseCreated) {
      const admin = new pg.Client({ connectionString: this.adminUrl });
      try {
        await admin.connect();
        await admin.query(`DROP DATABASE IF EXISTS "${this.databaseName}" WITH (FORCE)`);
        this.databaseCreated = false;
      } catch (error) {
        this.options.log(`could not drop ${this.databaseName}: ${String(error)}`);
      } finally {
        await admin.end().catch(() => undefined);
      }
    }
    // A Redis of this run's own (cluster or private server) goes with it.
    if (this.redisCluster || this.options.redis) return;
    await deleteKeys(this.redisUrl, `${this.keyPrefix}:*`).catch((error) =>
      this.options.log(`could not delete Redis keys ${this.keyPrefix}:*: ${String(error)}`),
    );
  }
}

/** Deletes this run's keys (its own prefix only), bounded in time. */
async function deleteKeys(redisUrl, pattern) {
  const redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
  await redis.connect();
  const deadline = Date.now() + 30_000;
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.unlink(...keys);
    } while (cursor !== '0' && Date.now() < deadline);
  } finally {
    redis.disconnect();
  }
}
