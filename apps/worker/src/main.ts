// A worker replica: hosts the conversations whose BullMQ jobs (leases) it
// holds and runs their agents. No public HTTP: only an internal health port.
import { hostname } from 'node:os';
import { AgentRegistry } from '@cs/agents';
import {
  ClusterKeys,
  ConnectionRegistry,
  ConversationHost,
  ConversationInbox,
  RedisRoomBroadcaster,
  UserConcurrencyLimiter,
  checkEvictionPolicy,
  leaseTiming,
  openPublisher,
  openRedis,
} from '@cs/cluster';
import { loadConfigOrExit } from '@cs/config';
import { ServiceMetrics } from '@cs/observability';
import { openStore } from '@cs/store';
import { startHealthServer } from './health.server.js';

const DRAIN_TIMEOUT_MS = 28_000;
const MAX_FAILOVERS = 5;
const FAILOVER_WINDOW_MS = 10 * 60_000;

function log(level: 'log' | 'warn' | 'error', message: string): void {
  const line = `${new Date().toISOString()} ${level.toUpperCase()} [Worker] ${message}\n`;
  (level === 'log' ? process.stdout : process.stderr).write(line);
}

async function main(): Promise<void> {
  const config = loadConfigOrExit('worker');
  const workerId = config.cluster.workerId ?? `worker-${hostname()}-${process.pid}`;
  const keys = new ClusterKeys(config.redis.keyPrefix);
  const redisUrl = config.redis.url!;

  const opened = await openStore({
    databaseUrl: config.database.url,
    dataDir: config.database.dataDir,
    migrate: config.database.migrateOnStart,
  });
  const redis = openRedis(redisUrl, `${workerId}:commands`);
  const subscriber = openRedis(redisUrl, `${workerId}:inbox`);
  const publisher = openPublisher(redisUrl, `${workerId}:publish`);
  const warning = await checkEvictionPolicy(redis);
  if (warning) log('warn', warning);

  const metrics = new ServiceMetrics({ role: 'worker', worker_id: workerId });
  const timing = leaseTiming(config.cluster.leaseTtlMs);
  const host = new ConversationHost({
    store: metrics.instrument(opened.store),
    agents: new AgentRegistry(),
    broadcaster: new RedisRoomBroadcaster(publisher, keys),
    inbox: new ConversationInbox(publisher, subscriber, keys),
    limiter: new UserConcurrencyLimiter(redis, keys, {
      limit: config.limits.maxConcurrentConversations,
      policy: config.limits.concurrencyPolicy,
      slotTtlMs: timing.slotTtlMs,
    }),
    connections: new ConnectionRegistry(redis, keys, workerId, timing.slotTtlMs),
    redis,
    keys,
    bullConnection: openRedis(redisUrl, `${workerId}:queue`),
    options: {
      workerId,
      concurrency: config.cluster.workerConcurrency,
      timing,
      idleTimeoutMs: config.limits.idleTimeoutMs,
      maxIterations: config.limits.maxIterations,
      maxFailovers: MAX_FAILOVERS,
      failoverWindowMs: FAILOVER_WINDOW_MS,
    },
    log,
  });
  metrics.setRunningConversationsSource(() => host.conversations.length);
  const health = await startHealthServer(config.http.workerPort, config.http.host, {
    workerId,
    conversations: () => host.conversations,
    draining: () => host.isDraining,
    registry: metrics.registry,
    checkDependencies: async () => {
      await opened.database.query('select 1');
      await redis.ping();
    },
  });
  host.start();
  log('log', `worker ${workerId} ready (health on port ${config.http.workerPort})`);

  let draining = false;
  const drain = (signal: string) => {
    if (draining) return log('log', `${signal} again: already draining`);
    draining = true;
    log('log', `${signal}: handing conversations over`);
    const deadline = setTimeout(() => {
      log('error', 'drain timed out; exiting');
      process.exit(1);
    }, DRAIN_TIMEOUT_MS);
    deadline.unref();
    const started = Date.now();
    host
      .drain()
      .then(async () => {
        log('log', `handed over in ${Date.now() - started} ms`);
        health.close();
        redis.disconnect();
        subscriber.disconnect();
        publisher.disconnect();
        await opened.close();
        process.exit(0);
      })
      .catch((error: unknown) => {
        log('error', `drain failed: ${error instanceof Error ? error.message : String(error)}`);
        process.exit(1);
      });
  };
  process.on('SIGTERM', () => drain('SIGTERM'));
  process.on('SIGINT', () => drain('SIGINT'));
}

main().catch((error: unknown) => {
  process.stderr.write(
    `worker failed to start: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
