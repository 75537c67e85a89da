// A worker replica: hosts the conversations whose BullMQ jobs (leases) it
// holds and runs their agents. No public HTTP: only an internal health port.
import { hostname } from 'node:os';
import { budgetHoldTtlMs, createAgentRuntime } from '@cs/agents';
import { modelBudget } from '@cs/core';
import {
  ClusterKeys,
  ClusteredConversationManager,
  ConnectionRegistry,
  ConversationHost,
  ConversationInbox,
  ConversationJobs,
  ConversationStops,
  LostJobReconciler,
  RedisRoomBroadcaster,
  ScopedStateChannel,
  UserConcurrencyLimiter,
  checkEvictionPolicy,
  checkRedisTarget,
  everyMaster,
  claimQueueCount,
  leaseTiming,
  openPublisher,
  openRedis,
  redisTarget,
  RedisBudgetLedger,
} from '@cs/cluster';
import {
  ServiceMetrics,
  continueTrace,
  databaseCheck,
  logCallback,
  redisCheck,
  traceContext,
} from '@cs/observability';
import { runService, type RunningService, type ServiceContext } from '@cs/process';
import { openStore } from '@cs/store';
import { hintWebhookWrites, setUpWebhookDelivery, webhookWakeChannel } from '@cs/webhooks';
import { startHealthServer } from './health.server.js';

/** Within the 30 s the contract gives a worker to exit after SIGTERM. */
const DRAIN_TIMEOUT_MS = 28_000;
const MAX_FAILOVERS = 5;
const FAILOVER_WINDOW_MS = 10 * 60_000;
/** Webhook attempts in flight at drain get this long; one cut short is sent again elsewhere. */
const WEBHOOK_STOP_GRACE_MS = 5_000;

async function main({ config, logger: root }: ServiceContext): Promise<RunningService> {
  const workerId = config.cluster.workerId ?? `worker-${hostname()}-${process.pid}`;
  const logger = root.child({ worker_id: workerId });
  const log = logCallback(logger, 'ConversationHost');
  const keys = new ClusterKeys(config.redis.keyPrefix);
  const redisUrl = redisTarget(config.redis);
  // REDIS_URL at a cluster node, REDIS_CLUSTER_URLS at a lone Redis or at no node: one line, no start.
  await checkRedisTarget(redisUrl);

  const opened = await openStore({
    databaseUrl: config.database.url,
    dataDir: config.database.dataDir,
    migrate: config.database.migrateOnStart,
    poolSize: config.database.poolSize,
    preparedStatements: config.database.preparedStatements,
    crossConversationBatches: config.database.crossConversationBatches,
  });
  const redis = openRedis(redisUrl, `${workerId}:commands`);
  const subscriber = openRedis(redisUrl, `${workerId}:inbox`);
  const publisher = openPublisher(redisUrl, `${workerId}:publish`);
  const warning = await checkEvictionPolicy(redis);
  if (warning) logger.warn(warning);
  const queueCount = config.cluster.conversationQueues;
  await claimQueueCount(redis, keys, queueCount);

  const metrics = new ServiceMetrics({ role: 'worker', worker_id: workerId });
  // Every worker sends webhook deliveries; the outbox's claims share them out.
  const webhooks = await setUpWebhookDelivery(opened.webhooks, config.webhooks, {
    onOutcome: (outcome) => metrics.webhookOutcome(outcome),
    onError: (message, error) => logger.warn(`${message}: ${String(error)}`),
  });
  metrics.setPendingWebhooksSource(() => opened.webhooks.countPending());
  const webhookHints = webhooks.enabled ? openRedis(redisUrl, `${workerId}:webhooks`) : null;
  if (webhookHints) {
    const channel = webhookWakeChannel(config.redis.keyPrefix);
    webhookHints.on('message', (_channel: string, conversationId: string) =>
      webhooks.wake(conversationId === '' ? undefined : conversationId),
    );
    await webhookHints.subscribe(channel);
  }
  const clusterMetrics = metrics.cluster();
  // Queued conversations, read at scrape time: the metric workers scale on.
  const jobs = new ConversationJobs(redis, keys, { queueCount });
  metrics.setWaitingConversationsSource(() => jobs.waitingCounts());
  const timing = leaseTiming(config.cluster.leaseTtlMs);
  const runtime = await createAgentRuntime(config, {
    onModelRequest: (seconds) => metrics.runtime().llmRequest(seconds),
    budget: modelBudget({
      limits: config.budgets,
      ledger: new RedisBudgetLedger(redis, keys, (tenantId, scope) =>
        opened.store.usageCost(tenantId, scope),
      ),
      holdTtlMs: budgetHoldTtlMs(config),
      onRejected: (scope) => metrics.budgetRejections.inc({ scope }),
    }),
  });
  const store = webhooks.enabled
    ? hintWebhookWrites(metrics.instrument(opened.store), (conversationId) =>
        webhooks.wake(conversationId),
      )
    : metrics.instrument(opened.store);
  const broadcaster = new RedisRoomBroadcaster(publisher, keys);
  const inbox = new ConversationInbox(publisher, subscriber, keys, {
    onWakeReceived: (seconds) => clusterMetrics.wakeupPickedUp(seconds),
    continueTrace,
  });
  const limiter = new UserConcurrencyLimiter(redis, keys, {
    limit: config.limits.maxConcurrentConversations,
    policy: config.limits.concurrencyPolicy,
    slotTtlMs: timing.slotTtlMs,
  });
  const connections = new ConnectionRegistry(redis, keys, workerId, timing.slotTtlMs);
  const host = new ConversationHost({
    store,
    agents: runtime.agents,
    metrics: clusterMetrics,
    broadcaster,
    inbox,
    scopedState: new ScopedStateChannel(publisher, subscriber, keys),
    limiter,
    connections,
    redis,
    keys,
    bullConnection: openRedis(redisUrl, `${workerId}:queue`),
    options: {
      workerId,
      concurrency: config.cluster.workerConcurrency,
      queueCount,
      runtime: runtime.sessionRuntime({ metrics: metrics.runtime(), tracing: traceContext }),
      timing,
      idleTimeoutMs: config.limits.idleTimeoutMs,
      maxIterations: config.limits.maxIterations,
      maxFailovers: MAX_FAILOVERS,
      failoverWindowMs: FAILOVER_WINDOW_MS,
    },
    log,
  });
  metrics.setRunningConversationsSource(() => host.conversations.length);
  // Live conversations whose job Redis lost are started again as a gateway starts them.
  const stops = new ConversationStops(redis, keys);
  const reconciler = new LostJobReconciler({
    store,
    jobs,
    stops,
    manager: new ClusteredConversationManager({
      store,
      broadcaster,
      jobs,
      inbox,
      stops,
      limiter,
      connections,
      limit: config.limits.maxConcurrentConversations,
      stopTimeoutMs: config.cluster.leaseTtlMs + 2_000,
      metrics: clusterMetrics,
    }),
    redis,
    keys,
    workerId,
    leaseTtlMs: config.cluster.leaseTtlMs,
    log: logCallback(logger, 'LostJobReconciler'),
    metrics: clusterMetrics,
  });
  const health = await startHealthServer(config.http.workerPort, config.http.host, {
    workerId,
    conversations: () => host.conversations,
    draining: () => host.isDraining,
    registry: metrics.registry,
    checks: [databaseCheck(opened.database), redisCheck(everyMaster(redis))],
  });
  host.start();
  webhooks.start();
  reconciler.start();
  logger.info(
    `worker ${workerId} ready (health on port ${config.http.workerPort}, ${queueCount} conversation queue${queueCount === 1 ? '' : 's'})`,
  );

  return {
    logger,
    async drain() {
      // Readiness turns 503 at once (the host says it is draining), then every lease goes back.
      await reconciler.stop();
      await Promise.all([host.drain(), webhooks.stop(WEBHOOK_STOP_GRACE_MS)]);
      webhookHints?.disconnect();
      health.close();
      await jobs.close();
      redis.disconnect();
      subscriber.disconnect();
      publisher.disconnect();
      await opened.close();
    },
  };
}

runService({ role: 'worker', drainTimeoutMs: DRAIN_TIMEOUT_MS }, main);
