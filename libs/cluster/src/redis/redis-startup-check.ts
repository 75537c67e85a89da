import { StartupError } from '@cs/config';
import { Redis } from 'ioredis';
import type { RedisTarget } from './redis-connections.js';

/** How long the start waits for a seed node to answer. */
const PROBE_TIMEOUT_MS = 3_000;

/**
 * Refuses the start (`StartupError`, one line naming the variable) when the
 * Redis it is given cannot be the deployment's: `REDIS_URL` at a node of a
 * Redis Cluster (every key of another node's slots would answer `MOVED`),
 * `REDIS_CLUSTER_URLS` at a lone Redis, or no seed node of
 * `REDIS_CLUSTER_URLS` answering (the cluster client would retry forever).
 * A `REDIS_URL` that does not answer yet is left to the connection, which
 * waits for it as before.
 */
export async function checkRedisTarget(target: RedisTarget): Promise<void> {
  if ('url' in target) {
    const node = await probe(target.url);
    if (node.reachable && node.clusterEnabled) {
      throw new StartupError(
        `REDIS_URL: ${node.address} is a node of a Redis Cluster; set REDIS_CLUSTER_URLS to its nodes instead`,
      );
    }
    return;
  }
  const nodes = await Promise.all(target.clusterUrls.map((url) => probe(url)));
  const lone = nodes.find((node) => node.reachable && !node.clusterEnabled);
  if (lone) {
    throw new StartupError(
      `REDIS_CLUSTER_URLS: ${lone.address} is a lone Redis, not a node of a Redis Cluster (cluster_enabled:0); set REDIS_URL to it instead`,
    );
  }
  if (!nodes.some((node) => node.reachable)) {
    const why = nodes.map((node) => `${node.address}: ${node.error}`).join(', ');
    throw new StartupError(`REDIS_CLUSTER_URLS: none of the seed nodes answers (${why})`);
  }
}

interface Probed {
  address: string;
  reachable: boolean;
  clusterEnabled: boolean;
  error?: string;
}

/** One connection attempt to one node, no retry: is it there, and is it in cluster mode? */
async function probe(url: string): Promise<Probed> {
  const parsed = new URL(url);
  const address = `${parsed.hostname}:${parsed.port || 6379}`;
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: PROBE_TIMEOUT_MS,
    commandTimeout: PROBE_TIMEOUT_MS,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    enableReadyCheck: false,
    protocol: 2,
  });
  // The connection's own error says why (ECONNREFUSED); the command's only that it closed.
  let connectionError: Error | undefined;
  redis.on('error', (error: Error) => (connectionError ??= error));
  try {
    await redis.connect();
    const info = await redis.info('cluster');
    return { address, reachable: true, clusterEnabled: /cluster_enabled:1/.test(info) };
  } catch (error) {
    const cause = connectionError ?? error;
    const message = cause instanceof Error ? cause.message : String(cause);
    return { address, reachable: false, clusterEnabled: false, error: message };
  } finally {
    redis.disconnect();
  }
}
