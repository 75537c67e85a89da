/**
 * The environment variables a process reads, each with its format and
 * default (docs/configuration.md): one zod schema, checked once at start by
 * `loadConfig`, which adds the rules that span variables.
 */
import { z } from 'zod';
import {
  CONCURRENCY_POLICIES,
  DEFAULT_MULTITASK_STRATEGY,
  MULTITASK_STRATEGIES,
  WEBHOOK_EVENT_TYPES,
} from '@cs/protocol';

const port = z.coerce.number().int().min(0).max(65_535);
const positiveInt = z.coerce.number().int().min(1);
const bool = z
  .enum(['true', 'false', '1', '0', 'yes', 'no'], { message: 'must be true or false' })
  .transform((v) => v === 'true' || v === '1' || v === 'yes');
const url = (protocols: string[]) =>
  z.string().refine(
    (value) => {
      try {
        return protocols.includes(new URL(value).protocol);
      } catch {
        return false;
      }
    },
    `must be a URL (${protocols.join(' or ')})`,
  );

/** `CONVERSATION_QUEUES`: 1, 2, 4, … 1024, written as a plain number. */
function isQueueCount(text: string): boolean {
  if (!/^[0-9]{1,4}$/.test(text)) return false;
  const count = Number(text);
  return count >= 1 && count <= 1024 && (count & (count - 1)) === 0;
}

/** Parses a JSON variable and checks it with `schema`: one problem line for the variable. */
const json = <T extends z.ZodType>(schema: T) =>
  z.string().transform((text, ctx): z.infer<T> => {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      ctx.addIssue({ code: 'custom', message: 'must be JSON' });
      return z.NEVER;
    }
    const parsed = schema.safeParse(value);
    if (parsed.success) return parsed.data;
    const why = parsed.error.issues
      .map((issue) => (issue.path.length > 0 ? `${issue.path.join('.')}: ` : '') + issue.message)
      .join('; ');
    ctx.addIssue({ code: 'custom', message: why });
    return z.NEVER;
  });
const commaList = z.string().transform((value) =>
  value
    .split(',')
    .map((item) => item.trim())
    .filter(Boolean),
);

const LlmPricesSchema = z.record(
  z.string().min(1),
  z.strictObject({ input: z.number().min(0), output: z.number().min(0) }),
);
const McpServerSchema = z.strictObject({
  url: url(['http:', 'https:']),
  headers: z.record(z.string(), z.string()).optional(),
  idempotent_tools: z.array(z.string().min(1)).optional(),
});
const McpServersSchema = z.record(
  z
    .string()
    .regex(/^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$/, 'server names are letters, digits, - and single _')
    .max(48),
  McpServerSchema,
);

/** `whsec_` and the key in base64 (Standard Webhooks): at least 16 bytes of key. */
const WEBHOOK_SECRET = /^whsec_(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const WebhookEndpointSchema = z.strictObject({
  url: url(['http:', 'https:']),
  secret: z
    .string()
    .refine(
      (secret) =>
        WEBHOOK_SECRET.test(secret) &&
        Buffer.from(secret.slice('whsec_'.length), 'base64').length >= 16,
      'must be whsec_ followed by the key in base64 (at least 16 bytes)',
    ),
  events: z.array(z.enum(WEBHOOK_EVENT_TYPES)).min(1).optional(),
  tenants: z.array(z.string().min(1)).min(1).optional(),
});
const WebhooksSchema = z
  .array(WebhookEndpointSchema)
  .refine(
    (endpoints) => new Set(endpoints.map((endpoint) => endpoint.url)).size === endpoints.length,
    'each url may appear once',
  );

export const EnvSchema = z.object({
  PORT: port.default(3000),
  HOST: z.string().min(1).optional(),
  CORS_ORIGINS: z
    .string()
    .transform((value) =>
      value
        .split(',')
        .map((origin) => origin.trim())
        .filter(Boolean),
    )
    .pipe(
      z.array(
        z
          .string()
          .regex(/^https?:\/\/[^/\s]+$/, 'must list origins such as https://app.example.com'),
      ),
    )
    .optional(),
  MAX_CONNECTIONS_PER_USER: positiveInt.max(100_000).default(50),
  WORKER_HTTP_PORT: port.default(3001),
  DATABASE_URL: url(['postgres:', 'postgresql:']).optional(),
  DATA_DIR: z.string().min(1).default('./.data'),
  DATABASE_POOL_SIZE: positiveInt.max(1_000).default(10),
  DATABASE_PREPARED_STATEMENTS: bool.default(true),
  DATABASE_CROSS_CONVERSATION_BATCHES: bool.default(true),
  REDIS_URL: url(['redis:', 'rediss:']).optional(),
  // A comma-separated list of URLs: `new URL('redis://a:1,b:2')` would throw.
  REDIS_CLUSTER_URLS: commaList
    .pipe(
      z
        .array(url(['redis:', 'rediss:']))
        .min(1, 'must list at least one seed node (redis://host:port, comma-separated)'),
    )
    .optional(),
  KEY_PREFIX: z
    .string()
    .regex(/^[A-Za-z0-9_.-]{1,64}$/, 'must be 1-64 letters, digits, _ . or -')
    .default('cs'),
  AUTH_JWT_SECRET: z.string().min(16, 'must be at least 16 characters').optional(),
  AUTH_JWKS_URL: url(['https:', 'http:']).optional(),
  AUTH_JWT_ISSUER: z.string().min(1).optional(),
  AUTH_JWT_AUDIENCE: z.string().min(1).optional(),
  AUTH_DEV_TOKENS: bool.optional(),
  AUTH_MAX_TOKEN_TTL_S: positiveInt.max(31_536_000).default(86_400),
  MAX_CONCURRENT_CONVERSATIONS: positiveInt.max(10_000).default(3),
  CONCURRENCY_POLICY: z.enum(CONCURRENCY_POLICIES).default('evict_oldest'),
  IDLE_TIMEOUT_MS: positiveInt.default(3_600_000),
  LEASE_TTL_MS: z.coerce.number().int().min(1000).default(15_000),
  WORKER_CONCURRENCY: positiveInt.max(100_000).default(200),
  CONVERSATION_QUEUES: z
    .string()
    .refine(isQueueCount, 'must be a power of two from 1 to 1024')
    .transform(Number)
    .default(1),
  AGENT: z
    .string()
    .regex(/^[a-z0-9][a-z0-9_.-]*$/, 'must be an agent name')
    .default('echo'),
  RATE_LIMIT_PER_MINUTE: z.coerce.number().int().min(0).default(600),
  MIGRATE_ON_START: bool.default(true),
  MAX_ITERATIONS: positiveInt.max(10_000).default(100),
  MAX_BUDGET_PER_TASK_USD: z.coerce.number().min(0).max(1e6).default(0),
  MULTITASK_STRATEGY: z.enum(MULTITASK_STRATEGIES).default(DEFAULT_MULTITASK_STRATEGY),
  AGENT_MODULES: z
    .string()
    .transform((value) =>
      value
        .split(',')
        .map((entry) => entry.trim())
        .filter(Boolean),
    )
    .optional(),
  WORKER_ID: z.string().min(1).max(128).optional(),
  LOG_LEVEL: z
    .enum(['error', 'warn', 'info', 'log', 'debug'])
    .transform((level) => (level === 'log' ? 'info' : level))
    .default('info'),
  LOG_FORMAT: z.enum(['json', 'pretty']).optional(),
  OTEL_EXPORTER_OTLP_ENDPOINT: url(['http:', 'https:']).optional(),
  LLM_PROVIDER: z.enum(['openai', 'anthropic']).default('openai'),
  LLM_BASE_URL: url(['http:', 'https:']).optional(),
  LLM_API_KEY: z.string().min(1).optional(),
  LLM_MODEL: z.string().min(1).max(256).optional(),
  LLM_MODELS: commaList.pipe(z.array(z.string().max(256))).optional(),
  LLM_TIMEOUT_MS: positiveInt.default(120_000),
  LLM_MAX_RETRIES: z.coerce.number().int().min(0).max(10).default(3),
  LLM_PRICES: json(LlmPricesSchema).optional(),
  LLM_CONTEXT_TOKENS: z.coerce.number().int().min(256).default(128_000),
  LLM_MAX_OUTPUT_TOKENS: z.coerce.number().int().min(1).max(1_000_000).default(4096),
  USER_BUDGET_USD_PER_DAY: z.coerce.number().min(0).max(1e9).default(0),
  TENANT_BUDGET_USD_PER_MONTH: z.coerce.number().min(0).max(1e12).default(0),
  MCP_SERVERS: json(McpServersSchema).optional(),
  TOOL_TIMEOUT_MS: positiveInt.default(30_000),
  AGENT_HTTP_URL: url(['http:', 'https:']).optional(),
  AGENT_HTTP_SECRET: z.string().min(16, 'must be at least 16 characters').optional(),
  AGENT_HTTP_TIMEOUT_MS: positiveInt.default(120_000),
  WEBHOOKS: json(WebhooksSchema).optional(),
  WEBHOOK_TIMEOUT_MS: positiveInt.max(600_000).default(10_000),
  WEBHOOK_MAX_ATTEMPTS: positiveInt.max(100).default(15),
  RETENTION_DAYS: z.coerce
    .number({ message: 'must be a number of days (0 keeps everything)' })
    .min(0, 'must not be negative (0 keeps everything)')
    .max(1_000_000)
    .default(0),
  RETENTION_SWEEP_INTERVAL_MS: positiveInt.max(2_147_483_647).default(3_600_000),
});

/** USD per million tokens, by model (`LLM_PRICES`). */
export type LlmPrices = z.infer<typeof LlmPricesSchema>;
/** One entry of `MCP_SERVERS`. */
export type McpServerConfig = z.infer<typeof McpServerSchema>;

export type Env = z.infer<typeof EnvSchema>;

/** Every environment variable the configuration reads. */
export const CONFIG_VARIABLES: readonly string[] = Object.keys(EnvSchema.shape);
