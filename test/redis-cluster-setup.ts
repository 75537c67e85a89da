// The e2e-redis-cluster project's Redis Cluster: started once before its files
// and stopped after them, instead of one per file (six nodes and a
// `--cluster create` each). The files share it as the other e2e files share
// the one Redis: each cluster they start has a key prefix of its own, and
// none of them injects a fault (the fault tests start their own).
import type { TestProject } from 'vitest/node';
import { SUITE_NODE_TIMEOUT_MS } from './support/test-redis.js';
import { startRedisCluster } from './support/redis-cluster.js';

export default async function startSuiteRedisCluster(
  project: TestProject,
): Promise<() => Promise<void>> {
  const cluster = await startRedisCluster({ nodeTimeoutMs: SUITE_NODE_TIMEOUT_MS });
  project.provide('testRedisClusterUrls', cluster.urls);
  return () => cluster.stop();
}
