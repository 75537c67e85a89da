// Which Redis the end-to-end suites of the cluster run on: one Redis (the
// default, REDIS_URL or 127.0.0.1:6379) or, with TEST_REDIS=cluster, a local
// Redis Cluster (3 masters, a replica each): the e2e-redis-cluster project's,
// started once for its files (test/redis-cluster-setup.ts), or else one this
// file starts and stops. The same test bodies run on either: `startCluster`
// gives its processes `REDIS_URL` or `REDIS_CLUSTER_URLS` from here.
import { afterAll, beforeAll, inject } from 'vitest';
import { Cluster, Redis } from 'ioredis';
import { startRedisCluster, type LocalRedisCluster } from './redis-cluster.js';
import { deleteKeys, testRedisUrl } from './services.js';

export type TestRedisKind = 'redis' | 'redis-cluster';

/** `TEST_REDIS=cluster` runs the suites on a Redis Cluster. */
export function testRedisKind(): TestRedisKind {
  const wanted = process.env.TEST_REDIS ?? 'redis';
  if (wanted === 'cluster' || wanted === 'redis-cluster') return 'redis-cluster';
  if (wanted === 'redis' || wanted === 'single') return 'redis';
  throw new Error(`TEST_REDIS must be "redis" or "cluster" (got ${JSON.stringify(wanted)})`);
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** `REDIS_CLUSTER_URLS` of the project's Redis Cluster (test/redis-cluster-setup.ts). */
    testRedisClusterUrls?: string;
  }
}

/** The file's own Redis Cluster, when its project started none. */
let local: LocalRedisCluster | null = null;

/**
 * The suites' Redis Cluster injects no fault (the fault tests start their
 * own): a node timeout far above the 2 s default, so that a node this busy
 * machine leaves unscheduled for a while is not failed over under a test.
 */
export const SUITE_NODE_TIMEOUT_MS = 20_000;

/**
 * When `TEST_REDIS=cluster` and the project started no Redis Cluster, starts
 * one for this file before its tests (and stops it after): call once at the
 * top of a test file.
 */
export function useTestRedis(): void {
  beforeAll(async () => {
    if (testRedisKind() === 'redis-cluster' && !projectClusterUrls() && !local) {
      local = await startRedisCluster({ nodeTimeoutMs: SUITE_NODE_TIMEOUT_MS });
    }
  }, 60_000);
  afterAll(async () => {
    await local?.stop();
    local = null;
  });
}

function projectClusterUrls(): string | undefined {
  return inject('testRedisClusterUrls');
}

/** The environment that points a process at the suite's Redis. */
export function testRedisEnv(): Record<string, string> {
  if (testRedisKind() === 'redis') return { REDIS_URL: testRedisUrl() };
  const urls = projectClusterUrls() ?? local?.urls;
  if (!urls) throw new Error('TEST_REDIS=cluster: call useTestRedis() at the top of the file');
  return { REDIS_CLUSTER_URLS: urls };
}

/** A client of the suite's Redis, for checks the API does not expose (disconnect it after). */
export function openTestRedis(): Redis | Cluster {
  const env = testRedisEnv();
  if (env.REDIS_URL) return new Redis(env.REDIS_URL, { maxRetriesPerRequest: 1 });
  const nodes = env.REDIS_CLUSTER_URLS!.split(',').map((url) => {
    const { hostname, port } = new URL(url);
    return { host: hostname, port: Number(port) };
  });
  return new Cluster(nodes, { redisOptions: { maxRetriesPerRequest: 1 } });
}

/** Removes every key under `<prefix>:` from the suite's Redis (on a cluster: from every master). */
export async function deleteTestKeys(prefix: string): Promise<void> {
  const redis = openTestRedis();
  redis.on('error', () => undefined);
  try {
    const masters = redis instanceof Cluster ? await clusterMasters(redis) : [redis];
    for (const master of masters) await deleteKeys(master, prefix, redis instanceof Cluster);
  } finally {
    redis.disconnect();
  }
}

async function clusterMasters(cluster: Cluster): Promise<Redis[]> {
  if (cluster.status !== 'ready') await new Promise((resolve) => cluster.once('ready', resolve));
  return cluster.nodes('master');
}
