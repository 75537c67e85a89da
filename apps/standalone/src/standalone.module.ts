import { Logger, type DynamicModule } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import type { AgentRuntime } from '@cs/agents';
import {
  StandaloneConversationManager,
  type ConversationStore,
  type UserKeyEraser,
} from '@cs/core';
import {
  AGENT_FACTORY,
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  ConversationRoomHub,
  DATA_LIFECYCLE_STORE,
  GatewayModule,
  InMemoryUserActionRateLimiter,
  READINESS_CHECKS,
  ServiceMetrics,
  USER_ACTION_RATE_LIMITER,
  WEBHOOK_OUTBOX,
  USER_KEY_ERASER,
  type ReadinessCheck,
} from '@cs/gateway';
import { databaseCheck, traceContext } from '@cs/observability';
import type { OpenedStore } from '@cs/store';
import { hintWebhookWrites, type WebhookDispatcher } from '@cs/webhooks';
import { hostname } from 'node:os';

const IDLE_CLEANUP_INTERVAL_MS = 30_000;
const CATCH_UP_INTERVAL_MS = 10_000;
/** Webhook attempts in flight at shutdown get this long; one cut short is sent again later. */
const WEBHOOK_STOP_GRACE_MS = 2_000;

/**
 * Wires the gateway edge to the in-process manager: the room hub is the
 * broadcaster, the embedded (or given) Postgres is the store.
 */
export const StandaloneModule = {
  create(
    config: AppConfig,
    opened: OpenedStore,
    webhooks: WebhookDispatcher,
    runtime: AgentRuntime,
    metrics: ServiceMetrics,
  ): { module: DynamicModule; shutdown: () => Promise<void> } {
    // Writes that may enqueue webhook deliveries wake the dispatcher at once.
    const store = hintWebhookWrites(metrics.instrument(opened.store), (conversationId) =>
      webhooks.wake(conversationId),
    );
    const { agents } = runtime;
    let manager: StandaloneConversationManager | undefined;
    const logger = new Logger('ConversationManager');
    const readiness: ReadinessCheck[] = [databaseCheck(opened.database)];
    const rateLimiter = new InMemoryUserActionRateLimiter(config.limits.rateLimitPerMinute);
    const module = GatewayModule.forRoot([
      { provide: APP_CONFIG, useValue: config },
      { provide: ServiceMetrics, useValue: metrics },
      { provide: CONVERSATION_STORE, useValue: store },
      { provide: WEBHOOK_OUTBOX, useValue: opened.webhooks },
      { provide: DATA_LIFECYCLE_STORE, useValue: opened.lifecycle },
      { provide: AGENT_FACTORY, useValue: agents },
      { provide: READINESS_CHECKS, useValue: readiness },
      { provide: USER_ACTION_RATE_LIMITER, useValue: rateLimiter },
      {
        // No Redis here: an erasure forgets the user's rate-limit window in memory.
        provide: USER_KEY_ERASER,
        useValue: {
          forgetConversation: () => Promise.resolve(),
          forgetUser: (tenantId: string, userId: string) => {
            rateLimiter.forget(tenantId, userId);
            return Promise.resolve();
          },
        } satisfies UserKeyEraser,
      },
      {
        provide: CONVERSATION_MANAGER,
        inject: [ConversationRoomHub],
        useFactory: (hub: ConversationRoomHub) => {
          manager = new StandaloneConversationManager({
            store: store satisfies ConversationStore,
            broadcaster: hub,
            agents,
            options: {
              maxConcurrentConversations: config.limits.maxConcurrentConversations,
              concurrencyPolicy: config.limits.concurrencyPolicy,
              idleTimeoutMs: config.limits.idleTimeoutMs,
              maxIterations: config.limits.maxIterations,
              runtime: runtime.sessionRuntime({
                metrics: metrics.runtime(),
                tracing: traceContext,
              }),
              ownerId: `standalone@${hostname()}:${process.pid}`,
              cleanupIntervalMs: Math.min(IDLE_CLEANUP_INTERVAL_MS, config.limits.idleTimeoutMs),
              // In one process a wake-up cannot be lost: the poll is only a safety net.
              catchUpIntervalMs: CATCH_UP_INTERVAL_MS,
            },
            metrics: metrics.cluster(),
            reportError: (message, error, fields) =>
              logger.warn({ msg: `${message}: ${String(error)}`, ...fields }),
          });
          metrics.setRunningConversationsSource(() => manager?.runningCount ?? 0);
          return manager;
        },
      },
    ]);
    const shutdown = async () => {
      await webhooks.stop(WEBHOOK_STOP_GRACE_MS);
      await manager?.shutdown();
      await opened.close();
    };
    return { module, shutdown };
  },
};
