// The standalone service: gateway and agent runtime in one process, with the
// embedded database (PGlite in DATA_DIR) unless DATABASE_URL is set, and no
// Redis. This is what `npm start` runs.
import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { loadConfigOrExit } from '@cs/config';
import type { ConversationManager } from '@cs/core';
import {
  CONVERSATION_MANAGER,
  TokenService,
  createHttpApp,
  drainOnSignals,
  DEV_TENANT_ID,
  DEV_USER_ID,
} from '@cs/gateway';
import { DataDirLockedError, openStore } from '@cs/store';
import { standaloneJwtSecret } from './jwt-secret.js';
import { StandaloneModule } from './standalone.module.js';

const SHUTDOWN_TIMEOUT_MS = 9_000;

async function main(): Promise<void> {
  const logger = new Logger('Standalone');
  let config = loadConfigOrExit('standalone');
  let opened;
  try {
    opened = await openStore({
      databaseUrl: config.database.url,
      dataDir: config.database.dataDir,
      migrate: config.database.migrateOnStart,
    });
  } catch (error) {
    if (error instanceof DataDirLockedError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(1);
    }
    throw error;
  }
  // This process owns the database: what ran before it stopped is resumed below.
  const interrupted = await opened.store.resetRunningStatuses();
  if (!config.auth.jwtSecret && !config.auth.jwksUrl) {
    config = {
      ...config,
      auth: { ...config.auth, jwtSecret: standaloneJwtSecret(config.database.dataDir) },
    };
  }

  const { module, shutdown } = StandaloneModule.create(config, opened);
  const app = await createHttpApp(module, config);
  drainOnSignals(app, { timeoutMs: SHUTDOWN_TIMEOUT_MS, beforeClose: shutdown });
  await app.listen(config.http.port, config.http.host);

  // Unanswered messages of conversations that were running are answered now.
  const manager = app.get<ConversationManager>(CONVERSATION_MANAGER);
  for (const ref of interrupted) {
    manager.ensureRunning(ref).catch((error: unknown) => {
      logger.warn(`could not resume ${ref.conversationId}: ${String(error)}`);
    });
  }
  if (interrupted.length > 0) logger.log(`resuming ${interrupted.length} conversation(s)`);

  const url = `http://localhost:${config.http.port}`;
  logger.log(`conversation service (standalone) listening on ${url}`);
  process.stdout.write(`\n  Web app:    ${url}/\n  API docs:   ${url}/docs\n`);
  const tokens = app.get(TokenService);
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
}

main().catch((error: unknown) => {
  process.stderr.write(
    `standalone failed to start: ${error instanceof Error ? error.message : String(error)}\n`,
  );
  process.exit(1);
});
