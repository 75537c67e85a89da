// The standalone service: gateway and agent runtime in one process, with the
// embedded database (PGlite in DATA_DIR) unless DATABASE_URL is set, and no
// Redis. This is what `npm start` runs.
import 'reflect-metadata';
import { LocalBudgetLedger, modelBudget, type ConversationManager } from '@cs/core';
import {
  CONVERSATION_MANAGER,
  TokenService,
  createHttpApp,
  drainHttpApp,
  DEV_TENANT_ID,
  DEV_USER_ID,
} from '@cs/gateway';
import {
  CLIENT_DRAIN_TIMEOUT_MS,
  runService,
  type RunningService,
  type ServiceContext,
} from '@cs/process';
import { openStore } from '@cs/store';
import { standaloneJwtSecret } from './jwt-secret.js';
import { budgetHoldTtlMs, createAgentRuntime } from '@cs/agents';
import { ServiceMetrics, conversationLogFields } from '@cs/observability';
import { setUpWebhookDelivery } from '@cs/webhooks';
import { StandaloneModule } from './standalone.module.js';

async function main(context: ServiceContext): Promise<RunningService> {
  const { logger } = context;
  let { config } = context;
  // A second process on the same DATA_DIR stops here (DataDirLockedError says why).
  const opened = await openStore({
    databaseUrl: config.database.url,
    dataDir: config.database.dataDir,
    migrate: config.database.migrateOnStart,
    poolSize: config.database.poolSize,
    preparedStatements: config.database.preparedStatements,
    crossConversationBatches: config.database.crossConversationBatches,
  });
  // This process owns the database: what ran before it stopped is resumed below.
  const interrupted = await opened.store.resetRunningStatuses();
  if (!config.auth.jwtSecret && !config.auth.jwksUrl) {
    config = {
      ...config,
      auth: { ...config.auth, jwtSecret: standaloneJwtSecret(config.database.dataDir) },
    };
  }

  const metrics = new ServiceMetrics({ role: 'standalone' });
  const webhooks = await setUpWebhookDelivery(opened.webhooks, config.webhooks, {
    onOutcome: (outcome) => metrics.webhookOutcome(outcome),
    onError: (message, error) => logger.warn(`${message}: ${String(error)}`),
  });
  metrics.setPendingWebhooksSource(() => opened.webhooks.countPending());
  const { module, shutdown } = StandaloneModule.create(
    config,
    opened,
    webhooks,
    await createAgentRuntime(config, {
      onModelRequest: (seconds) => metrics.runtime().llmRequest(seconds),
      budget: modelBudget({
        limits: config.budgets,
        ledger: new LocalBudgetLedger((tenantId, scope) => opened.store.usageCost(tenantId, scope)),
        holdTtlMs: budgetHoldTtlMs(config),
        onRejected: (scope) => metrics.budgetRejections.inc({ scope }),
      }),
    }),
    metrics,
  );
  const app = await createHttpApp(module, config, logger);
  await app.listen(config.http.port, config.http.host);
  webhooks.start();

  // Unanswered messages of conversations that were running are answered now.
  const manager = app.get<ConversationManager>(CONVERSATION_MANAGER);
  for (const ref of interrupted) {
    manager.ensureRunning(ref).catch((error: unknown) => {
      logger.warn(
        conversationLogFields(ref),
        `could not resume ${ref.conversationId}: ${String(error)}`,
      );
    });
  }
  if (interrupted.length > 0) logger.info(`resuming ${interrupted.length} conversation(s)`);

  const url = `http://localhost:${config.http.port}`;
  logger.info(`conversation service (standalone) listening on ${url}`);
  const tokens = app.get(TokenService);
  // The banner with a development token is for a person at a terminal: JSON
  // lines go to log collectors, and never carry a token.
  if (config.log.format === 'pretty') {
    process.stdout.write(`\n  Web app:    ${url}/\n  API docs:   ${url}/docs\n`);
    if (tokens.devTokensEnabled) {
      const token = await tokens.issueDevToken({
        userId: DEV_USER_ID,
        tenantId: DEV_TENANT_ID,
        roles: [],
      });
      process.stdout.write(
        `  Dev token:  ${token}\n              (user ${DEV_USER_ID}, tenant ${DEV_TENANT_ID}, valid 24 h)\n\n`,
      );
    }
  } else {
    logger.info(
      { web_app: `${url}/`, api_docs: `${url}/docs`, dev_tokens: tokens.devTokensEnabled },
      tokens.devTokensEnabled
        ? 'development tokens are on: POST /api/dev/token (LOG_FORMAT=pretty prints one)'
        : 'ready',
    );
  }
  return {
    logger,
    drain: () => drainHttpApp(app, { beforeClose: shutdown }),
  };
}

runService({ role: 'standalone', drainTimeoutMs: CLIENT_DRAIN_TIMEOUT_MS }, main);
