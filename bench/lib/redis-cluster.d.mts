// Types of redis-cluster.mjs, for the tests (test/support/redis-cluster.ts).
import type { ChildProcess } from 'node:child_process';

/** Node timeout of the local cluster: a master is failed over about 2 × this after it dies. */
export declare const CLUSTER_NODE_TIMEOUT_MS: number;

export interface RedisClusterNode {
  port: number;
  busPort: number;
  url: string;
  /** Replaced by `restart`. */
  process: ChildProcess;
}

export interface LocalRedisCluster {
  /** Every node, masters and replicas (roles change on failover: see `masters()`). */
  nodes: RedisClusterNode[];
  /** `REDIS_CLUSTER_URLS` for the apps: every node, comma-separated. */
  urls: string;
  /** The nodes that are masters now. */
  masters(): Promise<RedisClusterNode[]>;
  /** The replicas of the master on `port`, as it reports them. */
  replicasOf(port: number): Promise<RedisClusterNode[]>;
  /** The slot ranges [from, to] the master on `port` serves. */
  slotsOf(port: number): Promise<Array<[number, number]>>;
  /** kill -9 of a node. */
  kill(node: RedisClusterNode): Promise<void>;
  /** Starts a killed node again on its port and files: it rejoins (as a replica once failed over). */
  restart(node: RedisClusterNode): Promise<void>;
  /** `CLUSTER FAILOVER` on a replica: it takes over from its master. */
  failover(replica: RedisClusterNode): Promise<void>;
  /** Calls of each command on the masters so far (INFO commandstats, summed). */
  commandCalls(): Promise<Record<string, number>>;
  /** Process ids of the live nodes. */
  pids(): number[];
  /** Waits until every live node says `cluster_state:ok` and agrees on the slot owners. */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** Kills every node and removes the folder. */
  stop(): Promise<void>;
}

/** True when Debian's redis-server and redis-cli are installed (`.ci/run` installs them). */
export declare function redisClusterAvailable(): boolean;

export declare function waitForNode(
  port: number,
  timeoutMs?: number,
  child?: import('node:child_process').ChildProcess,
): Promise<void>;
/** `nodeTimeoutMs`: the nodes' `cluster-node-timeout` (default CLUSTER_NODE_TIMEOUT_MS). */
export declare function startRedisCluster(options?: {
  nodeTimeoutMs?: number;
}): Promise<LocalRedisCluster>;
export declare function parseCommandStats(text: string): Array<[string, number]>;
/** Calls of each command so far on the Redis (node) on `port` (INFO commandstats); {} when down. */
export declare function commandCallsAt(port: number): Promise<Record<string, number>>;
