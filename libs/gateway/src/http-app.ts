import { Logger, Module, type DynamicModule, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import type { NextFunction, Request, Response } from 'express';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Logger as PinoNestLogger } from 'nestjs-pino';
import type { AppConfig } from '@cs/config';
import type { ServiceLogger } from '@cs/observability';
import { MAX_PAYLOAD_BYTES } from '@cs/protocol';
import { DevTokenHosts } from './auth/dev-token-hosts.js';
import { authenticate } from './auth/http-auth.guard.js';
import { TokenService, bearerToken } from './auth/token.service.js';
import { answerClientErrors } from './http/client-errors.js';
import { HttpErrorFilter } from './http/error.filter.js';
import { mapError } from './http/error-mapping.js';
import { webAppAssets } from './http/web-app-assets.js';
import { ConfiguredIoAdapter } from './realtime/configured-io.adapter.js';
import { ConversationGateway } from './realtime/conversation.gateway.js';
import { EventStreamService } from './realtime/event-stream.service.js';
import { TurnWatchService } from './realtime/turn-watch.service.js';
import { UpgradedConnections } from './realtime/upgraded-connections.js';
import { LifecycleService } from './observability/lifecycle.service.js';
import { requestLoggingModule } from './observability/request-logging.js';

/** The app's module with the request logging around it. */
@Module({})
class HttpAppModule {
  static wrap(module: unknown, logger: ServiceLogger): DynamicModule {
    return {
      module: HttpAppModule,
      imports: [module as DynamicModule, requestLoggingModule(logger)],
    };
  }
}

/**
 * How long a socket told to disconnect has to close its side (a live client
 * answers within milliseconds) before its connection is cut.
 */
export const SOCKET_CLOSE_GRACE_MS = 1_000;

/** Each app's upgraded (WebSocket) connections, for its drain. */
const upgradedConnections = new WeakMap<INestApplication, UpgradedConnections>();

/** The web app (web/), built by scripts/build.mjs with Vite into `dist/web`. */
export const PUBLIC_DIR = fileURLToPath(new URL('../../../web', import.meta.url));

/**
 * Creates the HTTP + Socket.IO application of a gateway or standalone process:
 * JSON-only bodies (UTF-8) of at most 1 MiB, the contract's error bodies
 * everywhere (requests the HTTP parser refuses included), OpenAPI at `/docs`,
 * the web app at `/` under a Content-Security-Policy. Nest's logger (every
 * `new Logger()`) writes through `logger`, and each request makes one line.
 */
export async function createHttpApp(
  module: unknown,
  config: AppConfig,
  logger: ServiceLogger,
  configure: (app: NestExpressApplication) => void = () => undefined,
): Promise<NestExpressApplication> {
  const app = await NestFactory.create<NestExpressApplication>(HttpAppModule.wrap(module, logger), {
    bodyParser: false,
    bufferLogs: true,
  });
  app.useLogger(app.get(PinoNestLogger));
  app.flushLogs();
  app.disable('x-powered-by');
  app.set('query parser', 'simple');
  // Before anything answers (CORS preflights included): DNS rebinding.
  if (app.get(TokenService).devTokensEnabled) {
    app.use(refuseForeignHosts(new DevTokenHosts(config.http.corsOrigins)));
  }
  // No cross-origin access unless the operator names the origins.
  if (config.http.corsOrigins.length > 0) app.enableCors({ origin: config.http.corsOrigins });
  app.use(requireJsonBodies);
  app.use('/api/conversations', authenticateBeforeBody(app.get(TokenService)));
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
  if (existsSync(PUBLIC_DIR)) {
    app.use(webAppAssets(PUBLIC_DIR, { devTokens: app.get(TokenService).devTokensEnabled }));
  }

  app.useWebSocketAdapter(new ConfiguredIoAdapter(app, config.http.corsOrigins));
  upgradedConnections.set(app, new UpgradedConnections(app.getHttpServer()));
  answerClientErrors(app.getHttpServer());
  configure(app);
  await app.init();
  // Errors raised by Express middleware (body parsing) get the contract's body too.
  app.use((error: unknown, _request: Request, response: Response, next: NextFunction) => {
    if (response.headersSent) return next(error);
    const { status, body, headers } = mapError(error);
    response.status(status).set(headers).json(body);
  });
  return app;
}

/**
 * The conversations API checks the bearer token before the body is parsed
 * (the guard then finds the caller on the request): a stranger's megabyte of
 * deeply nested JSON is refused with 401 unread, where parsing it first cost
 * the event loop about 0.15 s.
 */
function authenticateBeforeBody(tokens: TokenService) {
  return (request: Request, _response: Response, next: NextFunction): void => {
    tokens.verify(bearerToken(request.headers.authorization)).then((principal) => {
      authenticate(request, principal);
      next();
    }, next);
  };
}

/** While development tokens are on: requests that name another host are refused (`DevTokenHosts`). */
function refuseForeignHosts(hosts: DevTokenHosts) {
  return (request: Request, response: Response, next: NextFunction): void => {
    if (DevTokenHosts.servesAnyHost(request.path) || hosts.allows(request.headers.host)) {
      return next();
    }
    const { status, body } = mapError(DevTokenHosts.refusal());
    response.status(status).json(body);
  };
}

/**
 * POST/PUT/PATCH with a body must declare `application/json`, in UTF-8 if it
 * names a charset (the body parser would decode UTF-16 and read garbage).
 */
function requireJsonBodies(request: Request, response: Response, next: NextFunction): void {
  const hasBody =
    request.headers['transfer-encoding'] !== undefined ||
    Number(request.headers['content-length'] ?? 0) > 0;
  if (!hasBody || !['POST', 'PUT', 'PATCH'].includes(request.method)) return next();
  if (!request.is('application/json')) {
    refuseBody(response, 'the body must be JSON (content-type: application/json)');
  } else if (!isUtf8(request.headers['content-type'] ?? '')) {
    refuseBody(
      response,
      'the body must be JSON in UTF-8 (content-type: application/json; charset=utf-8)',
    );
  } else {
    next();
  }
}

/** A content type that names no charset, or names `utf-8` (in any case, quoted or not). */
function isUtf8(contentType: string): boolean {
  const charset = contentType
    .split(';')
    .slice(1)
    .map((parameter) => parameter.split('=').map((part) => part.trim().toLowerCase()))
    .find(([name]) => name === 'charset');
  return charset === undefined || charset[1]?.replace(/^"(.*)"$/, '$1') === 'utf-8';
}

function refuseBody(response: Response, message: string): void {
  response.status(400).json({ error: { code: 'BAD_REQUEST', message } });
}

/**
 * The HTTP app's drain (run by `runService` of libs/process on the first
 * signal): readiness turns 503, sockets and streams close (clients reconnect
 * elsewhere and resume), then `beforeClose` runs (stop sessions, leave the
 * cluster), the app closes, and `afterClose` closes connections and stores.
 * The app's close waits for every socket's client to answer the close: the
 * connections of those that have not `SOCKET_CLOSE_GRACE_MS` into it (a
 * client frozen, or not reading) are cut, rather than holding the drain to its
 * deadline.
 */
export async function drainHttpApp(
  app: INestApplication,
  options: {
    /** Runs before the app closes (stop sessions, leave the cluster). */
    beforeClose: () => Promise<void>;
    /** Runs after the app closed (close connections and stores). */
    afterClose?: () => Promise<void>;
  },
): Promise<void> {
  app.get(LifecycleService).startDraining();
  app.get(ConversationGateway).disconnectAll();
  app.get(EventStreamService).closeAll();
  app.get(TurnWatchService).endAll();
  await options.beforeClose();
  const cut = setTimeout(() => {
    const count = upgradedConnections.get(app)?.destroyAll() ?? 0;
    if (count > 0) {
      new Logger(drainHttpApp.name).log(
        `cut ${count} socket connection(s) whose client did not answer the close within ${SOCKET_CLOSE_GRACE_MS} ms`,
      );
    }
  }, SOCKET_CLOSE_GRACE_MS);
  try {
    await app.close();
  } finally {
    clearTimeout(cut);
  }
  await options.afterClose?.();
}
