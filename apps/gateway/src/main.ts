// A gateway replica: REST and Socket.IO for clients. It runs no agent: user
// events go to Postgres, then to the conversation's worker through Redis.
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { createAgentRuntime } from '@cs/agents';
import {
  ClusterKeys,
  ClusteredConversationManager,
  ConnectionRegistry,
  ConversationInbox,
  ConversationJobs,
  ConversationStops,
  RedisRoomBroadcaster,
  RedisRoomSubscriber,
  RedisUserActionRateLimiter,
  RedisPeriodLock,
  RedisUserKeyEraser,
  UserConcurrencyLimiter,
  assertConnected,
  checkEvictionPolicy,
  checkRedisTarget,
  claimQueueCount,
  connected,
  everyMaster,
  leaseTiming,
  openRedis,
  openRequestPublisher,
  openRequestRedis,
  redisTarget,
} from '@cs/cluster';
import {
  AGENT_FACTORY,
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  ConversationRoomHub,
  DATA_LIFECYCLE_STORE,
  GatewayModule,
  READINESS_CHECKS,
  ROOM_BROADCASTER,
  RETENTION_LOCK,
  ROOM_TRAFFIC_SOURCE,
  SOCKET_ADAPTER_CHECK,
  ServiceMetrics,
  USER_ACTION_RATE_LIMITER,
  WEBHOOK_OUTBOX,
  USER_KEY_ERASER,
  createHttpApp,
  drainHttpApp,
  type ReadinessCheck,
} from '@cs/gateway';
import { conversationOfRoom } from '@cs/core';
import { currentTraceparent, databaseCheck, redisCheck } from '@cs/observability';
import {
  CLIENT_DRAIN_TIMEOUT_MS,
  runService,
  type RunningService,
  type ServiceContext,
} from '@cs/process';
import { openStore } from '@cs/store';
import { WEBHOOK_WRITES, hintWebhookWrites, webhookWakeChannel } from '@cs/webhooks';
import { RedisIoAdapter, checkShardedPubSub } from './redis-io.adapter.js';

const GATEWAY_LIVENESS_MS = 15_000;

async function main({ config, logger: root }: ServiceContext): Promise<RunningService> {
  const redisUrl = redisTarget(config.redis);
  // REDIS_URL at a cluster node, REDIS_CLUSTER_URLS at a lone Redis or at no node: one line, no start.
  await checkRedisTarget(redisUrl);
  const gatewayId = `gateway-${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const logger = root.child({ gateway_id: gatewayId });
  const keys = new ClusterKeys(config.redis.keyPrefix);

  const opened = await openStore({
    databaseUrl: config.database.url,
    dataDir: config.database.dataDir,
    migrate: config.database.migrateOnStart,
    poolSize: config.database.poolSize,
    preparedStatements: config.database.preparedStatements,
    crossConversationBatches: config.database.crossConversationBatches,
  });
  // What a client's request waits on fails at once while Redis is away (503,
  // nothing carried out later), and so do the Socket.IO adapter's publishes;
  // the connections' bookkeeping and the subscriptions wait the outage out.
  const requests = openRequestRedis(redisUrl, `${gatewayId}:requests`);
  const publisher = openRequestPublisher(redisUrl, `${gatewayId}:publish`);
  const redis = openRedis(redisUrl, `${gatewayId}:commands`);
  const subscriber = openRedis(redisUrl, `${gatewayId}:adapter-sub`);
  const inbox = new ConversationInbox(publisher, null, keys, { traceparent: currentTraceparent });
  // A room opened mid-step gets the step's text so far from the conversation's holder.
  const rooms = new RedisRoomSubscriber(openRedis(redisUrl, `${gatewayId}:rooms`), keys, (room) => {
    inbox.send(conversationOfRoom(room), { type: 'catch_up' }).catch(() => undefined);
  });
  const warning = await checkEvictionPolicy(redis);
  if (warning) logger.warn(warning);
  await checkShardedPubSub(redis, config.redis.clusterUrls ? 'REDIS_CLUSTER_URLS' : 'REDIS_URL');
  await claimQueueCount(redis, keys, config.cluster.conversationQueues);
  await Promise.all([connected(requests), connected(publisher)]);

  const metrics = new ServiceMetrics({ role: 'gateway', gateway_id: gatewayId });
  // Deliveries are sent by the workers; this gateway's writes that may
  // enqueue one wake them through Redis (a hint: they also poll).
  await opened.webhooks.syncEndpoints(config.webhooks.endpoints);
  metrics.setPendingWebhooksSource(() => opened.webhooks.countPending());
  const wakeChannel = webhookWakeChannel(config.redis.keyPrefix);
  const store =
    config.webhooks.endpoints.length === 0
      ? metrics.instrument(opened.store)
      : hintWebhookWrites(
          metrics.instrument(opened.store),
          (conversationId) =>
            void redis.publish(wakeChannel, conversationId ?? '').catch(() => undefined),
          WEBHOOK_WRITES.filter((write) => write !== 'append'),
        );
  const timing = leaseTiming(config.cluster.leaseTtlMs);
  const limiter = new UserConcurrencyLimiter(requests, keys, {
    limit: config.limits.maxConcurrentConversations,
    policy: config.limits.concurrencyPolicy,
    slotTtlMs: timing.slotTtlMs,
  });
  const connections = new ConnectionRegistry(redis, keys, gatewayId, GATEWAY_LIVENESS_MS);
  await connections.start();
  // Each start and wake-up carries the trace of the request that stored the message.
  const jobs = new ConversationJobs(requests, keys, {
    traceparent: currentTraceparent,
    queueCount: config.cluster.conversationQueues,
  });
  metrics.setWaitingConversationsSource(() => jobs.waitingCounts());
  const broadcaster = new RedisRoomBroadcaster(publisher, keys);
  const manager = new ClusteredConversationManager({
    store,
    broadcaster,
    jobs,
    inbox,
    stops: new ConversationStops(requests, keys),
    limiter,
    connections,
    limit: config.limits.maxConcurrentConversations,
    stopTimeoutMs: config.cluster.leaseTtlMs + 2_000,
    redis: requests,
    metrics: metrics.cluster(),
  });
  const readiness: ReadinessCheck[] = [
    databaseCheck(opened.database),
    redisCheck(everyMaster(requests)),
  ];
  const module = GatewayModule.forRoot([
    { provide: APP_CONFIG, useValue: config },
    { provide: ServiceMetrics, useValue: metrics },
    { provide: CONVERSATION_STORE, useValue: store },
    { provide: WEBHOOK_OUTBOX, useValue: opened.webhooks },
    { provide: DATA_LIFECYCLE_STORE, useValue: opened.lifecycle },
    { provide: USER_KEY_ERASER, useValue: new RedisUserKeyEraser(requests, keys) },
    { provide: RETENTION_LOCK, useValue: new RedisPeriodLock(requests, keys.retentionSweep) },
    { provide: CONVERSATION_MANAGER, useValue: manager },
    {
      provide: AGENT_FACTORY,
      useValue: (await createAgentRuntime(config, { withTools: false })).agents,
    },
    { provide: READINESS_CHECKS, useValue: readiness },
    { provide: ROOM_TRAFFIC_SOURCE, useValue: rooms },
    { provide: ROOM_BROADCASTER, useValue: broadcaster },
    {
      provide: SOCKET_ADAPTER_CHECK,
      useValue: () => {
        assertConnected(publisher);
        assertConnected(subscriber);
      },
    },
    {
      provide: USER_ACTION_RATE_LIMITER,
      useValue: new RedisUserActionRateLimiter(requests, keys, config.limits.rateLimitPerMinute),
    },
  ]);

  const app = await createHttpApp(module, config, logger, (nest) => {
    nest.useWebSocketAdapter(
      new RedisIoAdapter(nest, config.http.corsOrigins, publisher, subscriber, keys.socketIo),
    );
  });
  // After a Redis outage, whatever was published meanwhile is read from Postgres.
  const hub = app.get(ConversationRoomHub);
  rooms.onResync(() => hub.resyncAll());

  await app.listen(config.http.port, config.http.host);
  logger.info(`gateway ${gatewayId} listening on port ${config.http.port}`);
  return {
    logger,
    drain: () =>
      drainHttpApp(app, {
        beforeClose: async () => {
          await manager.shutdown();
          await jobs.close();
        },
        afterClose: async () => {
          requests.disconnect();
          redis.disconnect();
          subscriber.disconnect();
          publisher.disconnect();
          rooms.disconnect();
          await opened.close();
        },
      }),
  };
}

runService({ role: 'gateway', drainTimeoutMs: CLIENT_DRAIN_TIMEOUT_MS }, main);
