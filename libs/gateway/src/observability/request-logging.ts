/**
 * Nest's logger and one line per HTTP request, through nestjs-pino on the
 * process's pino logger. A request line carries the ids of the conversation
 * it touched (`conversation_id` from the path, `tenant_id` and `user_id` of
 * the caller) and never its query string, body or credentials. Probes and
 * scrapes log at `debug`, so that they do not drown the rest.
 */
import type { DynamicModule } from '@nestjs/common';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { LoggerModule } from 'nestjs-pino';
import type { ServiceLogger } from '@cs/observability';
import type { Principal } from '../auth/principal.js';

const PROBES = new Set(['/healthz', '/readyz', '/metrics']);
const CONVERSATION_PATH = /^\/api\/conversations\/([^/?#]+)/;

type LoggedRequest = IncomingMessage & {
  id?: unknown;
  originalUrl?: string;
  principal?: Principal;
};

/** The path alone: a query string may carry what must not be logged. */
export function pathOf(request: LoggedRequest): string {
  return (request.originalUrl ?? request.url ?? '/').split('?')[0] ?? '/';
}

/** `conversation_id`, `tenant_id`, `user_id` of a request, as far as known. */
export function requestLogFields(request: LoggedRequest): Record<string, string> {
  const fields: Record<string, string> = {};
  const conversation = CONVERSATION_PATH.exec(pathOf(request))?.[1];
  if (conversation) fields.conversation_id = decodeURIComponent(conversation);
  if (request.principal) {
    fields.tenant_id = request.principal.tenantId;
    fields.user_id = request.principal.userId;
  }
  return fields;
}

export function requestLoggingModule(logger: ServiceLogger): DynamicModule {
  return LoggerModule.forRoot({
    pinoHttp: {
      logger,
      // Lines written while a request runs carry its id, not the whole request.
      quietReqLogger: true,
      customLogLevel: (request: LoggedRequest, response: ServerResponse, error?: Error) => {
        if (error || response.statusCode >= 500) return 'error';
        if (PROBES.has(pathOf(request))) return 'debug';
        return 'info';
      },
      // Asked at the start (no caller known yet) and at the end: the ids go on the last line only.
      customProps: (request: LoggedRequest, response: ServerResponse) =>
        response.headersSent ? requestLogFields(request) : {},
      customSuccessMessage: (request: LoggedRequest, response: ServerResponse) =>
        `${request.method} ${pathOf(request)} ${response.statusCode}`,
      customErrorMessage: (request: LoggedRequest, response: ServerResponse) =>
        `${request.method} ${pathOf(request)} ${response.statusCode}`,
      serializers: {
        req: (request: { id?: unknown; method?: string; raw?: LoggedRequest; url?: string }) => ({
          id: request.id,
          method: request.method,
          path: request.raw ? pathOf(request.raw) : (request.url ?? '/').split('?')[0],
        }),
        res: (response: { statusCode?: number }) => ({ status: response.statusCode }),
      },
    },
  });
}
