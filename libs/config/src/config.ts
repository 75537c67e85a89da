import { z } from 'zod';

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

const EnvSchema = z.object({
  PORT: port.default(3000),
  HOST: z.string().min(1).default('0.0.0.0'),
  WORKER_HTTP_PORT: port.default(3001),
  DATABASE_URL: url(['postgres:', 'postgresql:']).optional(),
  DATA_DIR: z.string().min(1).default('./.data'),
  REDIS_URL: url(['redis:', 'rediss:']).optional(),
  KEY_PREFIX: z
    .string()
    .regex(/^[A-Za-z0-9_.-]{1,64}$/, 'must be 1-64 letters, digits, _ . or -')
    .default('cs'),
  AUTH_JWT_SECRET: z.string().min(16, 'must be at least 16 characters').optional(),
  AUTH_JWKS_URL: url(['https:', 'http:']).optional(),
  AUTH_JWT_ISSUER: z.string().min(1).optional(),
  AUTH_JWT_AUDIENCE: z.string().min(1).optional(),
  AUTH_DEV_TOKENS: bool.optional(),
  MAX_CONCURRENT_CONVERSATIONS: positiveInt.max(10_000).default(3),
  CONCURRENCY_POLICY: z.enum(['evict_oldest', 'reject']).default('evict_oldest'),
  IDLE_TIMEOUT_MS: positiveInt.default(3_600_000),
  LEASE_TTL_MS: z.coerce.number().int().min(1000).default(15_000),
  WORKER_CONCURRENCY: positiveInt.max(100_000).default(200),
  AGENT: z
    .string()
    .regex(/^[a-z0-9][a-z0-9_.-]*$/, 'must be an agent name')
    .default('echo'),
  RATE_LIMIT_PER_MINUTE: z.coerce.number().int().min(0).default(600),
  MIGRATE_ON_START: bool.default(true),
  MAX_ITERATIONS: positiveInt.max(10_000).default(100),
  WORKER_ID: z.string().min(1).max(128).optional(),
  LOG_LEVEL: z.enum(['error', 'warn', 'log', 'debug', 'verbose']).default('log'),
});

export type Env = z.infer<typeof EnvSchema>;

/** The validated configuration of one process. */
export interface AppConfig {
  role: ProcessRole;
  http: { host: string; port: number; workerPort: number };
  database: { url: string | undefined; dataDir: string; migrateOnStart: boolean };
  redis: { url: string | undefined; keyPrefix: string };
  auth: {
    jwtSecret: string | undefined;
    jwksUrl: string | undefined;
    issuer: string | undefined;
    audience: string | undefined;
    devTokens: boolean;
  };
  limits: {
    maxConcurrentConversations: number;
    concurrencyPolicy: 'evict_oldest' | 'reject';
    idleTimeoutMs: number;
    rateLimitPerMinute: number;
    maxIterations: number;
  };
  cluster: { leaseTtlMs: number; workerConcurrency: number; workerId: string | undefined };
  agent: { default: string };
  logLevel: Env['LOG_LEVEL'];
}

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
    if (!e.REDIS_URL) problems.push(`REDIS_URL: required by the ${role}`);
    if (!e.DATABASE_URL) problems.push(`DATABASE_URL: required by the ${role}`);
  }
  if (role === 'gateway' && !e.AUTH_JWT_SECRET && !e.AUTH_JWKS_URL) {
    problems.push('AUTH_JWT_SECRET: required by the gateway (or set AUTH_JWKS_URL)');
  }
  if (e.AUTH_JWT_SECRET && e.AUTH_JWKS_URL) {
    problems.push('AUTH_JWKS_URL: set either AUTH_JWT_SECRET or AUTH_JWKS_URL, not both');
  }
  if (problems.length > 0) throw new ConfigError(problems);

  return {
    role,
    http: { host: e.HOST, port: e.PORT, workerPort: e.WORKER_HTTP_PORT },
    database: { url: e.DATABASE_URL, dataDir: e.DATA_DIR, migrateOnStart: e.MIGRATE_ON_START },
    redis: { url: e.REDIS_URL, keyPrefix: e.KEY_PREFIX },
    auth: {
      jwtSecret: e.AUTH_JWT_SECRET,
      jwksUrl: e.AUTH_JWKS_URL,
      issuer: e.AUTH_JWT_ISSUER,
      audience: e.AUTH_JWT_AUDIENCE,
      devTokens: e.AUTH_DEV_TOKENS ?? role === 'standalone',
    },
    limits: {
      maxConcurrentConversations: e.MAX_CONCURRENT_CONVERSATIONS,
      concurrencyPolicy: e.CONCURRENCY_POLICY,
      idleTimeoutMs: e.IDLE_TIMEOUT_MS,
      rateLimitPerMinute: e.RATE_LIMIT_PER_MINUTE,
      maxIterations: e.MAX_ITERATIONS,
    },
    cluster: {
      leaseTtlMs: e.LEASE_TTL_MS,
      workerConcurrency: e.WORKER_CONCURRENCY,
      workerId: e.WORKER_ID,
    },
    agent: { default: e.AGENT },
    logLevel: e.LOG_LEVEL,
  };
}

function redact(name: string, value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  if (name.includes('SECRET')) return '***';
  if (name.endsWith('_URL')) return value.replace(/\/\/[^@/]*@/, '//***@');
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
