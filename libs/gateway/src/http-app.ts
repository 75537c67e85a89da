import { Logger, type INestApplication, type LogLevel } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import type { NextFunction, Request, Response } from 'express';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { AppConfig } from '@cs/config';
import { MAX_PAYLOAD_BYTES } from '@cs/protocol';
import { HttpErrorFilter } from './http/error.filter.js';
import { mapError } from './http/error-mapping.js';
import { ConfiguredIoAdapter } from './realtime/configured-io.adapter.js';
import { ConversationGateway } from './realtime/conversation.gateway.js';
import { EventStreamService } from './realtime/event-stream.service.js';
import { LifecycleService } from './observability/lifecycle.service.js';

/** Nest's levels for each configured level (`info` is Nest's `log`). */
const NEST_LEVELS: Record<AppConfig['log']['level'], LogLevel[]> = {
  error: ['fatal', 'error'],
  warn: ['fatal', 'error', 'warn'],
  info: ['fatal', 'error', 'warn', 'log'],
  debug: ['fatal', 'error', 'warn', 'log', 'debug', 'verbose'],
};

/** The web app (web/), built by scripts/build.mjs with Vite into `dist/web`. */
export const PUBLIC_DIR = fileURLToPath(new URL('../../../web', import.meta.url));

/**
 * Creates the HTTP + Socket.IO application of a gateway or standalone process:
 * JSON-only bodies of at most 1 MiB, the contract's error bodies everywhere,
 * OpenAPI at `/docs`, the demo page at `/`.
 */
export async function createHttpApp(
  module: unknown,
  config: AppConfig,
  configure: (app: NestExpressApplication) => void = () => undefined,
): Promise<NestExpressApplication> {
  const app = await NestFactory.create<NestExpressApplication>(module as never, {
    bodyParser: false,
    logger: NEST_LEVELS[config.log.level],
  });
  app.disable('x-powered-by');
  app.set('query parser', 'simple');
  // No cross-origin access unless the operator names the origins.
  if (config.http.corsOrigins.length > 0) app.enableCors({ origin: config.http.corsOrigins });
  app.use(requireJsonBodies);
  app.useBodyParser('json', { limit: MAX_PAYLOAD_BYTES, type: 'application/json' });
  app.useGlobalFilters(new HttpErrorFilter());

  const document = SwaggerModule.createDocument(
    app,
    new DocumentBuilder()
      .setTitle('Conversation service')
      .setDescription('Conversations for AI agents: see PROTOCOL.md for the full contract.')
      .addBearerAuth()
      .build(),
  );
  SwaggerModule.setup('docs', app, document, { jsonDocumentUrl: 'docs-json' });
  if (existsSync(PUBLIC_DIR)) app.useStaticAssets(PUBLIC_DIR, { index: 'index.html' });

  app.useWebSocketAdapter(new ConfiguredIoAdapter(app, config.http.corsOrigins));
  configure(app);
  await app.init();
  // Errors raised by Express middleware (body parsing) get the contract's body too.
  app.use((error: unknown, _request: Request, response: Response, next: NextFunction) => {
    if (response.headersSent) return next(error);
    const { status, body } = mapError(error);
    response.status(status).json(body);
  });
  return app;
}

/** POST/PUT/PATCH with a body must declare `application/json`. */
function requireJsonBodies(request: Request, response: Response, next: NextFunction): void {
  const hasBody =
    request.headers['transfer-encoding'] !== undefined ||
    Number(request.headers['content-length'] ?? 0) > 0;
  if (
    hasBody &&
    ['POST', 'PUT', 'PATCH'].includes(request.method) &&
    !request.is('application/json')
  ) {
    response.status(400).json({
      error: {
        code: 'BAD_REQUEST',
        message: 'the body must be JSON (content-type: application/json)',
      },
    });
    return;
  }
  next();
}

/**
 * Drains on the first SIGTERM or SIGINT and ignores repeats: readiness turns
 * 503, sockets and streams close (clients reconnect elsewhere and resume), then
 * `beforeClose` runs (stop sessions, close stores) and the process exits.
 */
export function drainOnSignals(
  app: INestApplication,
  options: {
    timeoutMs: number;
    /** Runs before the app closes (stop sessions, leave the cluster). */
    beforeClose: () => Promise<void>;
    /** Runs after the app closed (close connections and stores). */
    afterClose?: () => Promise<void>;
  },
): void {
  const logger = new Logger('Shutdown');
  let draining = false;
  const drain = (signal: string) => {
    if (draining) {
      logger.log(`${signal} again: already draining`);
      return;
    }
    draining = true;
    logger.log(`${signal}: draining`);
    const deadline = setTimeout(() => {
      logger.error('drain timed out; exiting');
      process.exit(1);
    }, options.timeoutMs);
    deadline.unref();
    const run = async () => {
      app.get(LifecycleService).startDraining();
      app.get(ConversationGateway).disconnectAll();
      app.get(EventStreamService).closeAll();
      await options.beforeClose();
      await app.close();
      await options.afterClose?.();
    };
    run().then(
      () => process.exit(0),
      (error: unknown) => {
        logger.error(error instanceof Error ? error.message : String(error));
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', () => drain('SIGTERM'));
  process.on('SIGINT', () => drain('SIGINT'));
}
