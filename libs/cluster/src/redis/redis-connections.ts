import { UnavailableError } from '@cs/core';
import { backoffDelay } from '@cs/protocol';
import calculateSlot from 'cluster-key-slot';
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';

/**
 * A connection to the deployment's Redis: one node (`REDIS_URL`) or a Redis
 * Cluster (`REDIS_CLUSTER_URLS`, ioredis' cluster client). Both take the same
 * commands; every command, script, transaction and pipeline we send names
 * keys of one slot (see `ClusterKeys`), so the code is the same on either.
 */
export type RedisConnection = Redis | Cluster;

/** Where the deployment's Redis is: `REDIS_URL`, or the seed nodes of `REDIS_CLUSTER_URLS`. */
export type RedisTarget = { url: string } | { clusterUrls: readonly string[] };

/** The target of the configuration (`config.redis`); throws when it names none. */
export function redisTarget(config: {
  url?: string | undefined;
  clusterUrls?: readonly string[] | undefined;
}): RedisTarget {
  if (config.clusterUrls && config.clusterUrls.length > 0)
    return { clusterUrls: config.clusterUrls };
  if (config.url) return { url: config.url };
  throw new Error('REDIS_URL or REDIS_CLUSTER_URLS is required');
}

/**
 * Opens an ioredis connection to `REDIS_URL` (its database number honoured)
 * or to a Redis Cluster. Its commands wait out an outage (BullMQ's Worker
 * needs `maxRetriesPerRequest: null`): for those a client's request waits
 * on, see `openRequestRedis`. RESP2 keeps replies in the shapes the
 * Socket.IO adapter and BullMQ were written for. No auto-pipelining: it
 * defers every command to the next turn of the event loop, and fails
 * commands defined with `defineCommand` (our Lua scripts) on one node.
 */
export function openRedis(url: string, name: string, options?: RedisOptions): Redis;
export function openRedis(
  target: string | RedisTarget,
  name: string,
  options?: RedisOptions,
  clusterOptions?: ClusterRetries,
): RedisConnection;
export function openRedis(
  target: string | RedisTarget,
  name: string,
  options: RedisOptions = {},
  clusterOptions: ClusterRetries = {},
): RedisConnection {
  const nodeOptions: RedisOptions = {
    connectionName: name,
    maxRetriesPerRequest: null,
    enableReadyCheck: true,
    protocol: 2,
    retryStrategy: (attempt) => backoffDelay(attempt, { baseMs: 50, maxMs: 2000 }),
    ...options,
  };
  const connection =
    typeof target === 'string' || 'url' in target
      ? new Redis(typeof target === 'string' ? target : target.url, nodeOptions)
      : openCluster(target.clusterUrls, nodeOptions, clusterOptions);
  // ioredis reconnects by itself; say so once per outage rather than on every attempt.
  let reported = false;
  connection.on('error', (error: Error) => {
    if (reported) return;
    reported = true;
    process.stderr.write(`redis (${name}): ${error.message}; reconnecting\n`);
  });
  connection.on('ready', () => {
    if (reported) process.stderr.write(`redis (${name}): connected again\n`);
    reported = false;
  });
  return connection;
}

/** How long the cluster client waits before it tries a command again on a failover. */
const CLUSTER_RETRY_DELAY_MS = 200;

/** What a connection may change of how the cluster client retries a command. */
export type ClusterRetries = Pick<ClusterOptions, 'maxRedirections'>;

/** How often a cluster client reads the slot map again, whatever its traffic. */
export const SLOTS_REFRESH_INTERVAL_MS = 5_000;

/**
 * The cluster client with the options of one node: credentials and TLS from
 * the seed URLs, commands on masters only, sharded channels through one
 * subscriber per master. A lost master is found again through the slot map
 * (`MOVED` after its replica took over), not by reconnecting to it; the
 * cluster as a whole reconnects as one node would (`retryStrategy`).
 */
function openCluster(
  urls: readonly string[],
  options: RedisOptions,
  retries: ClusterRetries,
): Cluster {
  const seeds = urls.map((raw) => new URL(raw));
  const first = seeds[0]!;
  const { retryStrategy, enableOfflineQueue, enableAutoPipelining, ...nodeOptions } = options;
  const clusterOptions: ClusterOptions = {
    scaleReads: 'master',
    shardedSubscribers: true,
    enableReadyCheck: true,
    // A failover or slot move answers MOVED/TRYAGAIN/CLUSTERDOWN for a few
    // seconds: ioredis retries those itself, this many times at these delays.
    maxRedirections: 16,
    retryDelayOnFailover: CLUSTER_RETRY_DELAY_MS,
    retryDelayOnClusterDown: CLUSTER_RETRY_DELAY_MS,
    retryDelayOnTryAgain: 100,
    slotsRefreshTimeout: 2_000,
    // The slot map is refreshed on MOVED and the like, which only traffic to
    // a moved slot meets: a client that sends nothing there after a failover
    // (a gateway's readiness asks every master) would keep a dead owner.
    slotsRefreshInterval: SLOTS_REFRESH_INTERVAL_MS,
    ...retries,
    clusterRetryStrategy: retryStrategy ? (times) => retryStrategy(times) : undefined,
    ...(enableOfflineQueue !== undefined && { enableOfflineQueue }),
    ...(enableAutoPipelining !== undefined && { enableAutoPipelining }),
    redisOptions: {
      ...nodeOptions,
      ...(first.username && { username: decodeURIComponent(first.username) }),
      ...(first.password && { password: decodeURIComponent(first.password) }),
      ...(first.protocol === 'rediss:' && { tls: {} }),
    },
  };
  return new Cluster(
    seeds.map((url) => ({ host: url.hostname, port: Number(url.port || 6379) })),
    clusterOptions,
  );
}

/**
 * A connection for PUBLISH only (events to the rooms, wake-ups to holders):
 * the publishes of one turn of the event loop leave in one write
 * (auto-pipelining), which under load saves a system call and a Redis wake-up
 * per message. Measured with 5,000 deltas/s (APPEND + PUBLISH) from one
 * process: Redis used 4 % of a core, against 12 % for the same commands each
 * written at once and 16 % for one Lua script per delta; the idle stream's
 * price is the deferral to the next turn (about 0.2 ms on the streaming
 * bench's floor). Not for commands defined with `defineCommand` (our Lua
 * scripts), which auto-pipelining cannot send on one node. On a cluster,
 * ioredis pipelines per node.
 */
export function openPublisher(url: string, name: string): Redis;
export function openPublisher(target: string | RedisTarget, name: string): RedisConnection;
export function openPublisher(target: string | RedisTarget, name: string): RedisConnection {
  return openRedis(target, name, { enableAutoPipelining: true });
}

/**
 * The longest a command on a request's path waits for its reply while the
 * connection looks up (Redis hung, or the network dropped without a reset).
 * Far above any answer a working Redis gives (well under a millisecond for
 * these commands, a few with a fork or an AOF rewrite); short enough that the
 * client hears `UNAVAILABLE` instead of giving up first. On a cluster it also
 * bounds ioredis' own retries of `TRYAGAIN`/`CLUSTERDOWN`/`MOVED` during a
 * failover.
 */
export const REQUEST_COMMAND_TIMEOUT_MS = 2_000;

/**
 * `reply`, or `UNAVAILABLE` once it has taken `REQUEST_COMMAND_TIMEOUT_MS`
 * (what it does later is not waited for): the bound of a request's command
 * for a client whose own retries may outlast it (a cluster's publish to a
 * master that died, retried until its replica took over).
 */
export async function answeredInTime<T>(reply: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new UnavailableError('Redis did not answer in time')),
      REQUEST_COMMAND_TIMEOUT_MS,
    );
  });
  try {
    return await Promise.race([reply, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * On a Redis Cluster, how many times a request's command is tried again
 * (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`, a master's connection closed), about
 * `REQUEST_COMMAND_TIMEOUT_MS` of retries in all: ioredis' timeout bounds
 * one attempt only, and a command to a master that died was otherwise
 * retried for as long as 16 attempts took (about 5 s in the bench) before
 * its replica answered or the client heard `UNAVAILABLE`.
 */
export const REQUEST_REDIRECTIONS = REQUEST_COMMAND_TIMEOUT_MS / CLUSTER_RETRY_DELAY_MS;

/**
 * A connection for the commands a client's request waits on (a gateway's
 * limits, stop marks, queue adds, wake-ups): while Redis is unreachable they
 * fail at once instead of waiting in the offline queue for as long as the
 * outage lasts, so that the request is answered `UNAVAILABLE` and what it
 * asked for is not carried out later, once the client has given up (and maybe
 * sent it again). A command in flight when the connection drops fails with it
 * and is never sent again after the reconnect; one unanswered for
 * `REQUEST_COMMAND_TIMEOUT_MS` fails. BullMQ takes such a connection for a
 * Queue (a producer); never for a Worker, whose blocking connection needs
 * `maxRetriesPerRequest: null`, nor for subscriptions. It refuses commands
 * until it is first connected: see `connected`.
 */
export function openRequestRedis(url: string, name: string, options?: RedisOptions): Redis;
export function openRequestRedis(
  target: string | RedisTarget,
  name: string,
  options?: RedisOptions,
): RedisConnection;
export function openRequestRedis(
  target: string | RedisTarget,
  name: string,
  options: RedisOptions = {},
): RedisConnection {
  return openRedis(
    target,
    name,
    {
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      autoResendUnfulfilledCommands: false,
      commandTimeout: REQUEST_COMMAND_TIMEOUT_MS,
      ...options,
    },
    { maxRedirections: REQUEST_REDIRECTIONS },
  );
}

/** `openPublisher`'s auto-pipelined PUBLISH, failing fast as `openRequestRedis`: a gateway's wake-ups. */
export function openRequestPublisher(url: string, name: string): Redis;
export function openRequestPublisher(target: string | RedisTarget, name: string): RedisConnection;
export function openRequestPublisher(target: string | RedisTarget, name: string): RedisConnection {
  return openRequestRedis(target, name, { enableAutoPipelining: true });
}

/** How long a start waits for Redis before it says once what it waits for. */
const SLOW_CONNECT_MS = 10_000;

/**
 * Resolves once the connection is up (at start, before it takes requests).
 * A start kept waiting says so once on stderr, with the connection's state,
 * rather than staying silent.
 */
export function connected(redis: RedisConnection): Promise<void> {
  if (redis.status === 'ready') return Promise.resolve();
  return new Promise((resolve) => {
    const slow = setTimeout(() => {
      const kind = redis instanceof Cluster ? 'Redis Cluster' : 'Redis';
      process.stderr.write(
        `still waiting for ${kind} after ${SLOW_CONNECT_MS / 1000} s (connection ${redis.status})\n`,
      );
    }, SLOW_CONNECT_MS);
    slow.unref();
    redis.once('ready', () => {
      clearTimeout(slow);
      resolve();
    });
  });
}

/**
 * Refuses (`UNAVAILABLE`) unless the connection is up: checked before
 * anything is stored that Redis must hand on, so that an outage refuses the
 * request whole instead of leaving it stored and not handed on. No round
 * trip: a Redis that stopped or restarts closes the connection at once (one
 * that hangs is caught by the commands' timeout). On a cluster the client is
 * `ready` while it has a slot map; a master that fails is caught by the
 * command (`CLUSTERDOWN`, a closed connection), which refuses the request.
 */
export function assertConnected(redis: Pick<RedisConnection, 'status'>): void {
  if (redis.status !== 'ready') {
    throw new UnavailableError('the service cannot reach Redis; try again shortly');
  }
}

/** Every master: the one node, or each master of the cluster's slot map. */
export function mastersOf(redis: RedisConnection): Redis[] {
  return redis instanceof Cluster ? redis.nodes('master') : [redis];
}

/**
 * The master serving `key`'s slot (the node itself on one Redis), for the
 * commands that carry no key but are about one (`PUBSUB SHARDNUMSUB`); null
 * while the slot map does not know it.
 */
export function masterFor(redis: RedisConnection, key: string): Redis | null {
  if (!(redis instanceof Cluster)) return redis;
  const nodeKey = redis.slots[calculateSlot(key)]?.[0];
  if (!nodeKey) return null;
  return (
    redis.nodes('master').find((node) => `${node.options.host}:${node.options.port}` === nodeKey) ??
    null
  );
}

/**
 * A PING to every master, and on a cluster `CLUSTER INFO` saying `ok`:
 * readiness fails while any master is unreachable or the cluster reports a
 * failed state.
 */
export async function pingEveryMaster(redis: RedisConnection): Promise<void> {
  if (!(redis instanceof Cluster)) {
    await redis.ping();
    return;
  }
  const masters = redis.nodes('master');
  if (masters.length === 0) throw new Error('the Redis Cluster has no known master');
  // A master that died leaves the client's pool at once, before the others
  // notice: each master of the slot map must be there, and answer.
  const known = new Set(masters.map((node) => `${node.options.host}:${node.options.port}`));
  for (const owner of new Set(redis.slots.map((nodes) => nodes[0]))) {
    if (owner !== undefined && !known.has(owner)) {
      // Ask the cluster again (a replica may have taken over): the next probe
      // sees the new owner rather than waiting for the next periodic refresh.
      redis.refreshSlotsCache();
      throw new Error(`Redis master ${owner} is unreachable`);
    }
  }
  await Promise.all(
    masters.map(async (node) => {
      const info = String(await node.cluster('INFO'));
      if (!/cluster_state:ok/.test(info)) {
        throw new Error(`${node.options.host}:${node.options.port} reports cluster_state fail`);
      }
    }),
  );
}

/**
 * Redis must not evict keys (BullMQ's and ours would vanish): returns a warning
 * when `maxmemory-policy` of any master is anything but `noeviction`, or null.
 */
export async function checkEvictionPolicy(redis: RedisConnection): Promise<string | null> {
  // The cluster's masters are known once its slot map is.
  if (redis instanceof Cluster) await connected(redis);
  const warnings = await Promise.all(
    mastersOf(redis).map(async (node) => {
      const where = redis instanceof Cluster ? ` on ${node.options.host}:${node.options.port}` : '';
      try {
        const reply = (await node.config('GET', 'maxmemory-policy')) as unknown;
        const values = Array.isArray(reply)
          ? (reply as string[])
          : Object.values(reply as Record<string, string>);
        const policy = values[values.length - 1];
        if (policy && policy !== 'noeviction') {
          return `Redis maxmemory-policy is "${policy}"${where}: set it to "noeviction", or queued conversations and limits may be lost`;
        }
        return null;
      } catch {
        return `could not read Redis maxmemory-policy${where} (CONFIG GET refused): make sure it is "noeviction"`;
      }
    }),
  );
  const found = warnings.filter((warning): warning is string => warning !== null);
  return found.length > 0 ? found.join('; ') : null;
}

/**
 * What readiness (`redisCheck` of libs/observability) asks of Redis: the
 * connection's status, and a PING that reaches every master.
 */
export function everyMaster(redis: RedisConnection): {
  readonly status: string;
  ping(): Promise<void>;
} {
  return {
    get status() {
      return redis.status;
    },
    ping: () => pingEveryMaster(redis),
  };
}
