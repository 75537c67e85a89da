/**
 * The configuration of one process: the environment read once, each
 * variable checked by its schema (env.schema.ts), then the rules that span
 * variables and roles, into one typed `AppConfig`.
 */
import type { ConcurrencyPolicy, MultitaskStrategy, WebhookEventType } from '@cs/protocol';
import { EnvSchema, type Env, type LlmPrices, type McpServerConfig } from './env.schema.js';

/** The process roles; a few defaults depend on the role. */
export type ProcessRole = 'standalone' | 'gateway' | 'worker' | 'tool';

/** One entry of `WEBHOOKS`. */
export interface WebhookEndpointConfig {
  url: string;
  /** `whsec_…`: never logged, never in an error, an event or a metric. */
  secret: string;
  /** The types sent to it; undefined: all. */
  events?: WebhookEventType[];
  /** The tenants whose messages it receives; undefined: all. */
  tenants?: string[];
}

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
  /** docs/protocol.md "Data lifecycle". */
  lifecycle: {
    /** Conversations idle this many days are deleted; 0 keeps everything. */
    retentionDays: number;
    retentionSweepIntervalMs: number;
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
  /** The `llm` agent's model server (docs/protocol.md "Configuration", `LLM_*`). */
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
  /** docs/protocol.md "Webhooks": the endpoints (secrets inside), one attempt's time, attempts. */
  webhooks: { endpoints: WebhookEndpointConfig[]; timeoutMs: number; maxAttempts: number };
}

export type LogLevel = 'error' | 'warn' | 'info' | 'debug';

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
  if (!parsed.success) {
    throw new ConfigError(
      parsed.error.issues.map((issue) => {
        const name = String(issue.path[0] ?? 'environment');
        const shown =
          raw[name] === undefined ? '' : ` (got ${JSON.stringify(redact(name, raw[name]))})`;
        return `${name}: ${issue.message}${shown}`;
      }),
    );
  }
  const e = parsed.data;
  const problems = crossVariableProblems(role, e);
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
    lifecycle: {
      retentionDays: e.RETENTION_DAYS,
      retentionSweepIntervalMs: e.RETENTION_SWEEP_INTERVAL_MS,
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
    webhooks: {
      endpoints: e.WEBHOOKS ?? [],
      timeoutMs: e.WEBHOOK_TIMEOUT_MS,
      maxAttempts: e.WEBHOOK_MAX_ATTEMPTS,
    },
  };
}

/** What a valid variable may still get wrong: the rules that span variables and roles. */
function crossVariableProblems(role: ProcessRole, e: Env): string[] {
  const problems: string[] = [];
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
  return problems;
}

function redact(name: string, value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  // MCP_SERVERS carries the servers' headers, which hold their credentials.
  // WEBHOOKS carries the endpoints' signing secrets.
  if (
    name.includes('SECRET') ||
    name.endsWith('_KEY') ||
    name === 'MCP_SERVERS' ||
    name === 'WEBHOOKS'
  )
    return '***';
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
