/**
 * The one logger of a process (docs/protocol.md "Operations"): one JSON object per
 * line with `level`, `time` and `msg` (LOG_FORMAT=json), or pino-pretty's
 * coloured text (LOG_FORMAT=pretty), at LOG_LEVEL. Nest's logger, the worker's
 * host and the migrate command all write through it.
 */
import { pino, type DestinationStream, type Logger } from 'pino';
import { PinoPretty } from 'pino-pretty';

export type ServiceLogger = Logger;
export type ServiceLogLevel = 'error' | 'warn' | 'info' | 'debug';

export interface ServiceLoggerOptions {
  level: ServiceLogLevel;
  format: 'json' | 'pretty';
  /** gateway, worker, standalone or the tool's name (`migrate`). */
  role: string;
  /** Fields on every line of this process (`worker_id`, `gateway_id`). */
  bindings?: Record<string, string>;
  /** Where lines go (tests); standard output by default. */
  destination?: DestinationStream;
}

const CENSOR = '[redacted]';

/**
 * Keys that may hold a credential, wherever a line's fields carry them: at
 * the top, one level down, and in request headers. Values are replaced, keys
 * kept, so that a line still says a header was there.
 */
const SECRET_KEYS = [
  'authorization',
  'cookie',
  'token',
  'accessToken',
  'access_token',
  'apiKey',
  'api_key',
  'secret',
  'jwtSecret',
  'password',
];
export const REDACTED_PATHS: string[] = [
  ...SECRET_KEYS,
  ...SECRET_KEYS.map((key) => `*.${key}`),
  ...SECRET_KEYS.map((key) => `*.*.${key}`),
  'req.headers["x-api-key"]',
  'headers["x-api-key"]',
  '*.headers["x-api-key"]',
];

export function createServiceLogger(options: ServiceLoggerOptions): ServiceLogger {
  const base = {
    service: 'conversation-service',
    role: options.role,
    pid: process.pid,
    ...options.bindings,
  };
  const redact = { paths: REDACTED_PATHS, censor: CENSOR };
  if (options.format === 'pretty') {
    // Synchronous, in this thread: lines written just before process.exit are not lost.
    const stream =
      options.destination ??
      PinoPretty({ sync: true, colorize: process.stdout.isTTY, ignore: 'pid,hostname,service' });
    return pino({ level: options.level, base, redact }, stream);
  }
  return pino(
    {
      level: options.level,
      base,
      redact,
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    options.destination ?? pino.destination({ dest: 1, sync: true }),
  );
}

/** The ids docs/protocol.md asks for on every line about a conversation. */
export interface ConversationLogFields {
  conversation_id: string;
  tenant_id: string;
  user_id: string;
  lease_epoch?: number;
}

/** `{ conversation_id, tenant_id, user_id, lease_epoch? }` of a conversation reference. */
export function conversationLogFields(
  ref: { tenantId: string; userId: string; conversationId: string },
  leaseEpoch?: number,
): ConversationLogFields {
  const fields: ConversationLogFields = {
    conversation_id: ref.conversationId,
    tenant_id: ref.tenantId,
    user_id: ref.userId,
  };
  if (leaseEpoch !== undefined) fields.lease_epoch = leaseEpoch;
  return fields;
}

/** The levels of call sites written for Nest's logger (`log` is `info`). */
export type CallbackLogLevel = 'log' | 'warn' | 'error' | 'debug';

/**
 * A `(level, message, fields?)` callback (the worker host's `log`) that writes
 * through the logger, under `context`. Fields are the line's ids
 * (`conversationLogFields`), never a message's content.
 */
export function logCallback(
  logger: ServiceLogger,
  context: string,
): (level: CallbackLogLevel, message: string, fields?: Record<string, unknown>) => void {
  const child = logger.child({ context });
  return (level, message, fields) => {
    const method = level === 'log' ? 'info' : level;
    if (fields) child[method](fields, message);
    else child[method](message);
  };
}
