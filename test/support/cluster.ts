// A whole cluster for end-to-end tests: N gateways and M workers from dist/,
// on a scratch Postgres database and a fresh Redis key prefix of their own, so
// that tests never see each other's conversations, queues or limits.
import pg from 'pg';
import type { StoredEvent } from '@cs/protocol';
import { api, devToken } from './clients.js';
import { startApp, type AppProcess } from './processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from './services.js';
import { deleteTestKeys, testRedisEnv } from './test-redis.js';

export const CLUSTER_SECRET = 'cluster-e2e-secret-0123456789abcdef';

export interface ClusterOptions {
  gateways?: number;
  workers?: number;
  /**
   * One Redis of the cluster's own (default: the suite's, one Redis or a
   * Redis Cluster as `TEST_REDIS` says; see test-redis.ts).
   */
  redisUrl?: string;
  /**
   * The DATABASE_URL the processes get for the cluster's database (default:
   * its URL), e.g. through PgBouncer; `sql` always connects directly.
   */
  databaseUrl?: (direct: string) => string;
  /** A Redis Cluster of the test's own (`REDIS_CLUSTER_URLS`), whatever `TEST_REDIS` says. */
  redisClusterUrls?: string;
  /** Extra environment for every process (limits, lease TTL, …). */
  env?: Record<string, string>;
  /** Node options of every process (`--import` of the tracing hook). */
  nodeArgs?: string[];
}

export interface TestCluster {
  /** The KEY_PREFIX of this cluster. */
  prefix: string;
  tenant: string;
  env: Record<string, string>;
  db: ScratchDatabase;
  /** A pool on the cluster's database, for checks the API does not expose. */
  sql: pg.Pool;
  gateways: AppProcess[];
  workers: AppProcess[];
  token(userId: string): Promise<string>;
  startWorker(): Promise<AppProcess>;
  /** Every process' output, for failure messages. */
  outputs(): string;
  /** Kills every process, drops the database and the cluster's Redis keys. */
  close(): Promise<void>;
}

export interface WorkerHealth {
  status: string;
  worker_id: string;
  conversations: string[];
}

export async function startCluster(options: ClusterOptions = {}): Promise<TestCluster> {
  const prefix = uniqueName('cse2e');
  const tenant = uniqueName('tenant');
  const db = await createScratchDatabase('cs_cluster', { migrated: true });
  const env: Record<string, string> = {
    DATABASE_URL: options.databaseUrl ? options.databaseUrl(db.url) : db.url,
    ...(options.redisUrl
      ? { REDIS_URL: options.redisUrl }
      : options.redisClusterUrls
        ? { REDIS_CLUSTER_URLS: options.redisClusterUrls }
        : testRedisEnv()),
    KEY_PREFIX: prefix,
    AUTH_JWT_SECRET: CLUSTER_SECRET,
    AUTH_DEV_TOKENS: 'true',
    // On, at the contract's default, so that every test runs the Redis limiter
    // as production does; no test sends that many actions of one user a minute.
    RATE_LIMIT_PER_MINUTE: '600',
    ...options.env,
  };
  const all: AppProcess[] = [];
  const gateways: AppProcess[] = [];
  const workers: AppProcess[] = [];
  let workerCount = 0;
  const startWorker = async () => {
    workerCount += 1;
    const name = `${prefix}-w${workerCount}`;
    const worker = await startApp(
      'worker',
      { ...env, WORKER_ID: name },
      { name, nodeArgs: options.nodeArgs },
    );
    all.push(worker);
    workers.push(worker);
    return worker;
  };
  const startGateway = async (index: number) => {
    const gateway = await startApp('gateway', env, {
      name: `gateway-${index + 1}`,
      nodeArgs: options.nodeArgs,
    });
    all.push(gateway);
    gateways.push(gateway);
    return gateway;
  };
  const sql = new pg.Pool({ connectionString: db.url, max: 4 });
  // Dropping the database (WITH FORCE) ends idle connections still closing: expected.
  sql.on('error', () => undefined);
  const cluster: TestCluster = {
    prefix,
    tenant,
    env,
    db,
    sql,
    gateways,
    workers,
    token: (userId) => devToken(gateways[0]!.url, { user_id: userId, tenant_id: tenant }),
    startWorker,
    outputs: () =>
      all.map((proc) => `----- ${proc.name}\n${proc.output().slice(-6000)}`).join('\n'),
    async close() {
      for (const proc of all) proc.signal('SIGKILL');
      await Promise.all(all.map((proc) => proc.exited));
      await cluster.sql.end();
      await db.drop();
      if (!options.redisUrl && !options.redisClusterUrls) await deleteTestKeys(prefix);
    },
  };
  try {
    // All at once: migrations run under an advisory lock, so replicas may start together.
    await Promise.all([
      ...Array.from({ length: options.gateways ?? 1 }, (_, i) => startGateway(i)),
      ...Array.from({ length: options.workers ?? 1 }, () => startWorker()),
    ]);
    // Listed in start order, whatever order they became healthy in.
    gateways.sort((a, b) => a.name.localeCompare(b.name));
    workers.sort((a, b) => a.name.localeCompare(b.name));
  } catch (error) {
    await cluster.close().catch(() => undefined);
    throw error;
  }
  return cluster;
}

/** The worker's `/healthz`, or null when it does not answer (killed, stopped, exited). */
export async function workerHealth(worker: AppProcess): Promise<WorkerHealth | null> {
  try {
    const response = await fetch(`${worker.url}/healthz`, { signal: AbortSignal.timeout(1000) });
    return response.ok ? ((await response.json()) as WorkerHealth) : null;
  } catch {
    return null;
  }
}

/** Waits until exactly one of `workers` lists the conversation, and returns it. */
export async function holderOf(
  workers: readonly AppProcess[],
  conversationId: string,
  timeoutMs = 10_000,
): Promise<AppProcess> {
  let holder: AppProcess | undefined;
  await until(
    async () => {
      const listing = await Promise.all(
        workers.map(async (w) => (await workerHealth(w))?.conversations.includes(conversationId)),
      );
      const holders = workers.filter((_, i) => listing[i]);
      holder = holders.length === 1 ? holders[0] : undefined;
      return holder !== undefined;
    },
    `one worker holding ${conversationId}`,
    timeoutMs,
  );
  return holder!;
}

/** Polls `check` until it holds; throws after `timeoutMs`. */
export async function until(
  check: () => Promise<boolean> | boolean,
  what: string | (() => string),
  timeoutMs = 10_000,
  intervalMs = 50,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) {
      const described = typeof what === 'string' ? what : what();
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${described}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Every stored event of the conversation, through the REST API, in id order. */
export async function readAllEvents(
  baseUrl: string,
  token: string,
  conversationId: string,
): Promise<StoredEvent[]> {
  const all: StoredEvent[] = [];
  for (;;) {
    const page = await api<{ events: StoredEvent[]; has_more: boolean }>(
      baseUrl,
      'GET',
      `/api/conversations/${conversationId}/events?start_id=${all.length}&limit=100`,
      { token },
    );
    if (page.status !== 200) throw new Error(`events: ${page.status} ${JSON.stringify(page.body)}`);
    all.push(...page.body.events);
    if (!page.body.has_more) return all;
  }
}
