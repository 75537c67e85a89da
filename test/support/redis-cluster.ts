// A local Redis Cluster for tests, from Debian's redis-server (7.0): three
// masters with a replica each, on free ports in a temporary folder. The code
// is shared with the benchmark and the chaos run (bench/lib/redis-cluster.mjs).
export {
  CLUSTER_NODE_TIMEOUT_MS,
  redisClusterAvailable,
  startRedisCluster,
  waitForNode,
  type LocalRedisCluster,
  type RedisClusterNode,
} from '../../bench/lib/redis-cluster.mjs';
