import { z } from 'zod';
import {
  CONCURRENCY_POLICIES,
  DEFAULT_MULTITASK_STRATEGY,
  MULTITASK_STRATEGIES,
  type ConcurrencyPolicy,
  type MultitaskStrategy,
} from '@cs/protocol';

/** The process roles; a few defaults depend on the role. */
export type ProcessRole = 'standalone' | 'gateway' | 'worker' | 'tool';

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

const EnvSchema = z.object({
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
});

/** USD per million tokens, by model (`LLM_PRICES`). */
export type LlmPrices = z.infer<typeof LlmPricesSchema>;
/** One entry of `MCP_SERVERS`. */
export type McpServerConfig = z.infer<typeof McpServerSchema>;

export type Env = z.infer<typeof EnvSchema>;

/** The validated configuration of one process. */
export interface AppConfig {
  role: ProcessRole;
  http: {
    host: string;
    port: number;
    workerPort: number;
    /** Origins of other sites allowed to call the API and open sockets (none by default). */
    corsOrigins: string[];
  };
  database: {
    url: string | undefined;
    dataDir: string;
    migrateOnStart: boolean;
    /** Postgres connections this process opens at most. */
    poolSize: number;
    /** False sends every statement unprepared (a pooler in transaction mode). */
    preparedStatements: boolean;
    /** False writes each append in a statement of its own conversation (Citus). */
    crossConversationBatches: boolean;
  };
  /**
   * One Redis (`url`) or the seed nodes of a Redis Cluster (`clusterUrls`);
   * at most one of them is set, and gateways and workers need one.
   */
  redis: { url: string | undefined; clusterUrls: string[] | undefined; keyPrefix: string };
  auth: {
    jwtSecret: string | undefined;
    jwksUrl: string | undefined;
    issuer: string | undefined;
    audience: string | undefined;
    devTokens: boolean;
    /** A token whose `exp` lies further ahead than this many seconds is refused. */
    maxTokenTtlS: number;
  };
  limits: {
    maxConcurrentConversations: number;
    concurrencyPolicy: ConcurrencyPolicy;
    idleTimeoutMs: number;
    rateLimitPerMinute: number;
    maxIterations: number;
    /** The most one turn may cost; 0: no limit. */
    maxBudgetUsd: number;
    /** Sockets and SSE streams one user may hold open on one process. */
    maxConnectionsPerUser: number;
  };
  cluster: {
    leaseTtlMs: number;
    workerConcurrency: number;
    workerId: string | undefined;
    /** BullMQ queues live conversations are spread over (a power of two, 1..1024). */
    conversationQueues: number;
  };
  agent: {
    default: string;
    multitaskStrategy: MultitaskStrategy;
    /** ES modules (paths or package names) that register agents and tools. */
    modules: string[];
  };
  log: { level: LogLevel; format: 'json' | 'pretty' };
  /** OTLP/HTTP endpoint of the trace collector; traces are off when unset. */
  otlpEndpoint: string | undefined;
  /** The `llm` agent's model server (PROTOCOL.md "Configuration", `LLM_*`). */
  llm: {
    provider: 'openai' | 'anthropic';
    /** Unset: the provider's own. */
    baseUrl: string | undefined;
    /** Never logged, never in an event, an error or a metric. */
    apiKey: string | undefined;
    /** The default model; the `llm` agent exists only when it is set. */
    model: string | undefined;
    /** The models `agent_config.model` may name (`LLM_MODEL` always among them). */
    models: string[];
    timeoutMs: number;
    maxRetries: number;
    prices: LlmPrices;
    contextTokens: number;
    /** `LLM_MAX_OUTPUT_TOKENS`: the cap sent with every model request; budgets reserve against it. */
    maxOutputTokens: number;
  };
  /** What model requests may cost (0: no such budget); see "Usage and budgets". */
  budgets: { userUsdPerDay: number; tenantUsdPerMonth: number };
  /** MCP servers whose tools agents may call, by server name (headers are secrets). */
  mcp: { servers: Record<string, McpServerConfig> };
  tools: { timeoutMs: number };
  /** The remote agent of the `http` agent; `secret` is set whenever `url` is. */
  agentHttp: { url: string | undefined; secret: string | undefined; timeoutMs: number };
}

export type LogLevel = 'error' | 'warn' | 'info' | 'debug';

/** Every environment variable the configuration reads. */
export const CONFIG_VARIABLES: readonly string[] = Object.keys(EnvSchema.shape);

/** Thrown with one line per invalid variable. */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/** Reads and validates the environment once. Empty strings count as unset. */
export function loadConfig(
  role: ProcessRole,
  env: Record<string, string | undefined> = process.env,
): AppConfig {
  const raw: Record<string, string> = {};
  for (const key of Object.keys(EnvSchema.shape)) {
    const value = env[key];
    if (value !== undefined && value.trim() !== '') raw[key] = value.trim();
  }
  const parsed = EnvSchema.safeParse(raw);
  const problems = parsed.success
    ? []
    : parsed.error.issues.map((issue) => {
        const name = String(issue.path[0] ?? 'environment');
        const shown =
          raw[name] === undefined ? '' : ` (got ${JSON.stringify(redact(name, raw[name]))})`;
        return `${name}: ${issue.message}${shown}`;
      });
  if (!parsed.success) throw new ConfigError(problems);
  const e = parsed.data;

  if (role === 'gateway' || role === 'worker') {
    if (!e.REDIS_URL && !e.REDIS_CLUSTER_URLS)
      problems.push(`REDIS_URL: required by the ${role} (or set REDIS_CLUSTER_URLS)`);
    if (!e.DATABASE_URL) problems.push(`DATABASE_URL: required by the ${role}`);
  }
  if (role === 'gateway' && !e.AUTH_JWT_SECRET && !e.AUTH_JWKS_URL) {
    problems.push('AUTH_JWT_SECRET: required by the gateway (or set AUTH_JWKS_URL)');
  }
  if (e.REDIS_URL && e.REDIS_CLUSTER_URLS) {
    problems.push('REDIS_CLUSTER_URLS: set either REDIS_URL or REDIS_CLUSTER_URLS, not both');
  }
  if (e.AUTH_JWT_SECRET && e.AUTH_JWKS_URL) {
    problems.push('AUTH_JWKS_URL: set either AUTH_JWT_SECRET or AUTH_JWKS_URL, not both');
  }
  if (e.AUTH_DEV_TOKENS === true && role !== 'standalone' && !e.AUTH_JWT_SECRET) {
    problems.push('AUTH_DEV_TOKENS: development tokens need AUTH_JWT_SECRET on this process');
  }
  if (e.AGENT_HTTP_URL && !e.AGENT_HTTP_SECRET) {
    problems.push('AGENT_HTTP_SECRET: required with AGENT_HTTP_URL');
  }
  if (e.LLM_MODELS && e.LLM_MODELS.length > 0 && !e.LLM_MODEL) {
    problems.push('LLM_MODEL: required with LLM_MODELS (the default model)');
  }
  if (problems.length > 0) throw new ConfigError(problems);

  // Development tokens sign with a generated secret, never with an operator's
  // one unless the operator says so; while they are on, only this host is served.
  const operatorKeys = e.AUTH_JWT_SECRET !== undefined || e.AUTH_JWKS_URL !== undefined;
  const devTokens = e.AUTH_DEV_TOKENS ?? (role === 'standalone' && !operatorKeys);
  return {
    role,
    http: {
      host: e.HOST ?? (devTokens ? '127.0.0.1' : '0.0.0.0'),
      port: e.PORT,
      workerPort: e.WORKER_HTTP_PORT,
      corsOrigins: e.CORS_ORIGINS ?? [],
    },
    database: {
      url: e.DATABASE_URL,
      dataDir: e.DATA_DIR,
      migrateOnStart: e.MIGRATE_ON_START,
      poolSize: e.DATABASE_POOL_SIZE,
      preparedStatements: e.DATABASE_PREPARED_STATEMENTS,
      crossConversationBatches: e.DATABASE_CROSS_CONVERSATION_BATCHES,
    },
    redis: { url: e.REDIS_URL, clusterUrls: e.REDIS_CLUSTER_URLS, keyPrefix: e.KEY_PREFIX },
    auth: {
      jwtSecret: e.AUTH_JWT_SECRET,
      jwksUrl: e.AUTH_JWKS_URL,
      issuer: e.AUTH_JWT_ISSUER,
      audience: e.AUTH_JWT_AUDIENCE,
      devTokens,
      maxTokenTtlS: e.AUTH_MAX_TOKEN_TTL_S,
    },
    limits: {
      maxConcurrentConversations: e.MAX_CONCURRENT_CONVERSATIONS,
      concurrencyPolicy: e.CONCURRENCY_POLICY,
      idleTimeoutMs: e.IDLE_TIMEOUT_MS,
      rateLimitPerMinute: e.RATE_LIMIT_PER_MINUTE,
      maxIterations: e.MAX_ITERATIONS,
      maxBudgetUsd: e.MAX_BUDGET_PER_TASK_USD,
      maxConnectionsPerUser: e.MAX_CONNECTIONS_PER_USER,
    },
    cluster: {
      leaseTtlMs: e.LEASE_TTL_MS,
      workerConcurrency: e.WORKER_CONCURRENCY,
      workerId: e.WORKER_ID,
      conversationQueues: e.CONVERSATION_QUEUES,
    },
    agent: {
      default: e.AGENT,
      multitaskStrategy: e.MULTITASK_STRATEGY,
      modules: e.AGENT_MODULES ?? [],
    },
    log: {
      level: e.LOG_LEVEL,
      format: e.LOG_FORMAT ?? (process.stdout.isTTY ? 'pretty' : 'json'),
    },
    otlpEndpoint: e.OTEL_EXPORTER_OTLP_ENDPOINT,
    llm: {
      provider: e.LLM_PROVIDER,
      baseUrl: e.LLM_BASE_URL,
      apiKey: e.LLM_API_KEY,
      model: e.LLM_MODEL,
      models: [...new Set([...(e.LLM_MODEL ? [e.LLM_MODEL] : []), ...(e.LLM_MODELS ?? [])])],
      timeoutMs: e.LLM_TIMEOUT_MS,
      maxRetries: e.LLM_MAX_RETRIES,
      prices: e.LLM_PRICES ?? {},
      contextTokens: e.LLM_CONTEXT_TOKENS,
      maxOutputTokens: e.LLM_MAX_OUTPUT_TOKENS,
    },
    budgets: {
      userUsdPerDay: e.USER_BUDGET_USD_PER_DAY,
      tenantUsdPerMonth: e.TENANT_BUDGET_USD_PER_MONTH,
    },
    mcp: { servers: e.MCP_SERVERS ?? {} },
    tools: { timeoutMs: e.TOOL_TIMEOUT_MS },
    agentHttp: {
      url: e.AGENT_HTTP_URL,
      secret: e.AGENT_HTTP_SECRET,
      timeoutMs: e.AGENT_HTTP_TIMEOUT_MS,
    },
  };
}

function redact(name: string, value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  // MCP_SERVERS carries the servers' headers, which hold their credentials.
  if (name.includes('SECRET') || name.endsWith('_KEY') || name === 'MCP_SERVERS') return '***';
  if (name.endsWith('_URL') || name.endsWith('_URLS'))
    return value.replace(/\/\/[^@/,]*@/g, '//***@');
  return value;
}

/** Loads the configuration, or prints one line per problem and exits. */
export function loadConfigOrExit(role: ProcessRole): AppConfig {
  try {
    return loadConfig(role);
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`${error.message}\n`);
      process.exit(1);
    }
    throw error;
  }
}
