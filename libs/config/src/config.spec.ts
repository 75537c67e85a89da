import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.js';

const cluster = {
  DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/postgres',
  REDIS_URL: 'redis://127.0.0.1:6379/2',
  AUTH_JWT_SECRET: 'a-secret-of-at-least-16-chars',
};

function problemsOf(role: Parameters<typeof loadConfig>[0], env: Record<string, string>): string[] {
  try {
    loadConfig(role, env);
  } catch (error) {
    if (error instanceof ConfigError) return error.problems;
    throw error;
  }
  return [];
}

describe('loadConfig', () => {
  it('applies the documented defaults', () => {
    const config = loadConfig('standalone', {});
    expect(config.http.port).toBe(3000);
    expect(config.http.workerPort).toBe(3001);
    expect(config.database.dataDir).toBe('./.data');
    expect(config.database.url).toBeUndefined();
    expect(config.redis.keyPrefix).toBe('cs');
    expect(config.auth.devTokens).toBe(true);
    expect(config.limits).toMatchObject({
      maxConcurrentConversations: 3,
      concurrencyPolicy: 'evict_oldest',
      idleTimeoutMs: 3_600_000,
      rateLimitPerMinute: 600,
    });
    expect(config.cluster).toMatchObject({ leaseTtlMs: 15_000, workerConcurrency: 200 });
    expect(config.agent.default).toBe('echo');
  });

  it('reads the Postgres pool size, prepared statements and cross-conversation batches', () => {
    expect(loadConfig('standalone', {}).database).toMatchObject({
      poolSize: 10,
      preparedStatements: true,
      crossConversationBatches: true,
    });
    expect(
      loadConfig('worker', {
        ...cluster,
        DATABASE_POOL_SIZE: '40',
        DATABASE_PREPARED_STATEMENTS: 'false',
        DATABASE_CROSS_CONVERSATION_BATCHES: 'false',
      }).database,
    ).toMatchObject({ poolSize: 40, preparedStatements: false, crossConversationBatches: false });
  });

  it.each([
    ['DATABASE_POOL_SIZE', '0'],
    ['DATABASE_POOL_SIZE', 'ten'],
    ['DATABASE_POOL_SIZE', '2.5'],
    ['DATABASE_PREPARED_STATEMENTS', 'off'],
    ['DATABASE_CROSS_CONVERSATION_BATCHES', 'maybe'],
  ])('refuses %s=%s with one line naming it', (name, value) => {
    const problems = problemsOf('worker', { ...cluster, [name]: value });
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(new RegExp(`^${name}: `));
  });

  it('turns development tokens off outside the standalone mode', () => {
    expect(loadConfig('gateway', cluster).auth.devTokens).toBe(false);
    expect(loadConfig('gateway', { ...cluster, AUTH_DEV_TOKENS: 'true' }).auth.devTokens).toBe(
      true,
    );
  });

  it('signs development tokens only with a generated secret unless told to', () => {
    const generated = loadConfig('standalone', {});
    expect(generated.auth.devTokens).toBe(true);
    expect(generated.http.host).toBe('127.0.0.1');
    const operator = loadConfig('standalone', { AUTH_JWT_SECRET: cluster.AUTH_JWT_SECRET });
    expect(operator.auth.devTokens).toBe(false);
    expect(operator.http.host).toBe('0.0.0.0');
    const jwks = loadConfig('standalone', { AUTH_JWKS_URL: 'https://idp.example.com/jwks' });
    expect(jwks.auth.devTokens).toBe(false);
    const explicit = loadConfig('standalone', {
      AUTH_JWT_SECRET: cluster.AUTH_JWT_SECRET,
      AUTH_DEV_TOKENS: 'true',
    });
    expect(explicit.auth.devTokens).toBe(true);
    expect(explicit.http.host).toBe('127.0.0.1');
    expect(loadConfig('standalone', { HOST: '0.0.0.0' }).http.host).toBe('0.0.0.0');
  });

  it('allows no cross-origin access unless origins are named', () => {
    expect(loadConfig('standalone', {}).http.corsOrigins).toEqual([]);
    expect(
      loadConfig('standalone', { CORS_ORIGINS: 'https://app.example.com, http://localhost:5173' })
        .http.corsOrigins,
    ).toEqual(['https://app.example.com', 'http://localhost:5173']);
    expect(problemsOf('standalone', { CORS_ORIGINS: '*' })).toHaveLength(1);
  });

  it('reads CONVERSATION_QUEUES, a power of two from 1 to 1024 (default 1)', () => {
    expect(loadConfig('worker', cluster).cluster.conversationQueues).toBe(1);
    for (const count of [1, 2, 8, 256, 1024]) {
      const env = { ...cluster, CONVERSATION_QUEUES: String(count) };
      expect(loadConfig('worker', env).cluster.conversationQueues).toBe(count);
    }
    for (const bad of ['0', '3', '12', '2048', '-8', '8.0', '1e3', 'eight', '0x10']) {
      expect(problemsOf('gateway', { ...cluster, CONVERSATION_QUEUES: bad })).toEqual([
        `CONVERSATION_QUEUES: must be a power of two from 1 to 1024 (got ${JSON.stringify(bad)})`,
      ]);
    }
  });

  it('reads the log level and the per-user connection cap', () => {
    const defaults = loadConfig('standalone', {});
    expect(defaults.log.level).toBe('info');
    expect(defaults.limits.maxConnectionsPerUser).toBe(50);
    expect(loadConfig('standalone', { LOG_LEVEL: 'log' }).log.level).toBe('info');
    expect(loadConfig('standalone', { LOG_FORMAT: 'json' }).log.format).toBe('json');
    expect(problemsOf('standalone', { LOG_LEVEL: 'verbose' })).toHaveLength(1);
  });

  it('names each invalid variable in its own line', () => {
    const problems = problemsOf('standalone', {
      PORT: 'eighty',
      MAX_CONCURRENT_CONVERSATIONS: '0',
      CONCURRENCY_POLICY: 'random',
      LEASE_TTL_MS: '10',
      REDIS_URL: 'http://nope',
      KEY_PREFIX: 'has spaces',
      RATE_LIMIT_PER_MINUTE: '-1',
      AUTH_DEV_TOKENS: 'perhaps',
    });
    for (const name of [
      'PORT',
      'MAX_CONCURRENT_CONVERSATIONS',
      'CONCURRENCY_POLICY',
      'LEASE_TTL_MS',
      'REDIS_URL',
      'KEY_PREFIX',
      'RATE_LIMIT_PER_MINUTE',
      'AUTH_DEV_TOKENS',
    ]) {
      expect(
        problems.filter((line) => line.startsWith(`${name}:`)),
        name,
      ).toHaveLength(1);
    }
    expect(problems).toHaveLength(8);
  });

  it('requires Redis, Postgres and a token key for cluster processes', () => {
    expect(problemsOf('gateway', {})).toEqual([
      'REDIS_URL: required by the gateway (or set REDIS_CLUSTER_URLS)',
      'DATABASE_URL: required by the gateway',
      'AUTH_JWT_SECRET: required by the gateway (or set AUTH_JWKS_URL)',
    ]);
    expect(problemsOf('worker', { REDIS_URL: cluster.REDIS_URL })).toEqual([
      'DATABASE_URL: required by the worker',
    ]);
  });

  it('takes the seed nodes of a Redis Cluster instead of REDIS_URL, never both', () => {
    const { REDIS_URL: _single, ...withoutRedis } = cluster;
    const seeds = 'redis://10.0.0.1:7000, rediss://user:pw@10.0.0.2:7001';
    const config = loadConfig('worker', { ...withoutRedis, REDIS_CLUSTER_URLS: seeds });
    expect(config.redis).toMatchObject({
      url: undefined,
      clusterUrls: ['redis://10.0.0.1:7000', 'rediss://user:pw@10.0.0.2:7001'],
    });
    expect(problemsOf('gateway', { ...cluster, REDIS_CLUSTER_URLS: seeds })).toEqual([
      'REDIS_CLUSTER_URLS: set either REDIS_URL or REDIS_CLUSTER_URLS, not both',
    ]);
    const bad = problemsOf('worker', {
      ...withoutRedis,
      REDIS_CLUSTER_URLS: 'redis://user:hunter2@a:7000,b:7001',
    });
    expect(bad).toHaveLength(1);
    expect(bad[0]).toMatch(/^REDIS_CLUSTER_URLS: must be a URL/);
    expect(bad[0]).not.toMatch(/hunter2/);
    expect(problemsOf('worker', { ...withoutRedis, REDIS_CLUSTER_URLS: ' , ' })).toEqual([
      'REDIS_CLUSTER_URLS: must list at least one seed node (redis://host:port, comma-separated) (got ",")',
    ]);
  });

  it('never prints a secret or a password', () => {
    const problems = problemsOf('gateway', {
      ...cluster,
      AUTH_JWT_SECRET: 'short',
      DATABASE_URL: 'mysql://user:hunter2@db/x',
    });
    expect(problems.join('\n')).not.toMatch(/short|hunter2/);
    expect(problems.some((line) => line.startsWith('AUTH_JWT_SECRET:'))).toBe(true);
  });

  it('treats empty variables as unset', () => {
    expect(loadConfig('standalone', { PORT: '', DATABASE_URL: ' ' }).http.port).toBe(3000);
  });

  it('reads the model server, MCP servers, tool and HTTP agent settings with their defaults', () => {
    const defaults = loadConfig('standalone', {});
    expect(defaults.llm).toEqual({
      provider: 'openai',
      baseUrl: undefined,
      apiKey: undefined,
      model: undefined,
      models: [],
      timeoutMs: 120_000,
      maxRetries: 3,
      prices: {},
      contextTokens: 128_000,
      maxOutputTokens: 4096,
    });
    expect(defaults.budgets).toEqual({ userUsdPerDay: 0, tenantUsdPerMonth: 0 });
    expect(defaults.mcp).toEqual({ servers: {} });
    expect(defaults.tools).toEqual({ timeoutMs: 30_000 });
    expect(defaults.agentHttp).toEqual({ url: undefined, secret: undefined, timeoutMs: 120_000 });

    const config = loadConfig('standalone', {
      LLM_PROVIDER: 'anthropic',
      LLM_BASE_URL: 'http://127.0.0.1:8080',
      LLM_API_KEY: 'sk-test',
      LLM_MODEL: 'small',
      LLM_MODELS: 'big, small ,other',
      LLM_TIMEOUT_MS: '5000',
      LLM_MAX_RETRIES: '0',
      LLM_PRICES: '{"small":{"input":0.5,"output":1.5}}',
      LLM_CONTEXT_TOKENS: '4000',
      LLM_MAX_OUTPUT_TOKENS: '512',
      USER_BUDGET_USD_PER_DAY: '1.5',
      TENANT_BUDGET_USD_PER_MONTH: '100',
      MCP_SERVERS:
        '{"files":{"url":"http://127.0.0.1:9000/mcp","headers":{"authorization":"Bearer x"},"idempotent_tools":["read"]}}',
      TOOL_TIMEOUT_MS: '1000',
      AGENT_HTTP_URL: 'http://127.0.0.1:9100/step',
      AGENT_HTTP_SECRET: 'an-hmac-secret-of-16+',
      AGENT_HTTP_TIMEOUT_MS: '2000',
    });
    expect(config.llm).toEqual({
      provider: 'anthropic',
      baseUrl: 'http://127.0.0.1:8080',
      apiKey: 'sk-test',
      model: 'small',
      models: ['small', 'big', 'other'],
      timeoutMs: 5000,
      maxRetries: 0,
      prices: { small: { input: 0.5, output: 1.5 } },
      contextTokens: 4000,
      maxOutputTokens: 512,
    });
    expect(config.budgets).toEqual({ userUsdPerDay: 1.5, tenantUsdPerMonth: 100 });
    expect(config.mcp.servers).toEqual({
      files: {
        url: 'http://127.0.0.1:9000/mcp',
        headers: { authorization: 'Bearer x' },
        idempotent_tools: ['read'],
      },
    });
    expect(config.tools.timeoutMs).toBe(1000);
    expect(config.agentHttp).toEqual({
      url: 'http://127.0.0.1:9100/step',
      secret: 'an-hmac-secret-of-16+',
      timeoutMs: 2000,
    });
    expect(loadConfig('standalone', { LLM_MODEL: 'm' }).llm.models).toEqual(['m']);
  });

  it('checks the JSON variables with one line each, and the HTTP agent secret', () => {
    const problems = problemsOf('standalone', {
      LLM_PRICES: '{"m":{"input":-1,"output":"x"}}',
      MCP_SERVERS: '{"bad name":{"url":"ftp://x"}}',
      LLM_PROVIDER: 'gemini',
      AGENT_HTTP_URL: 'http://127.0.0.1:9100/step',
    });
    expect(problems.filter((line) => line.startsWith('LLM_PRICES:'))).toHaveLength(1);
    expect(problems.filter((line) => line.startsWith('MCP_SERVERS:'))).toHaveLength(1);
    expect(problems.filter((line) => line.startsWith('LLM_PROVIDER:'))).toHaveLength(1);
    expect(problems).toHaveLength(3);
    expect(problemsOf('standalone', { LLM_PRICES: 'not json' })).toEqual([
      'LLM_PRICES: must be JSON (got "not json")',
    ]);
    expect(problemsOf('standalone', { AGENT_HTTP_URL: 'http://127.0.0.1:9100/step' })).toEqual([
      'AGENT_HTTP_SECRET: required with AGENT_HTTP_URL',
    ]);
    expect(problemsOf('standalone', { LLM_MODELS: 'a,b' })).toEqual([
      'LLM_MODEL: required with LLM_MODELS (the default model)',
    ]);
  });

  it('never prints the model key, the HMAC secret or MCP headers', () => {
    const problems = problemsOf('standalone', {
      LLM_API_KEY: ' ',
      AGENT_HTTP_SECRET: 'too-short-hmac',
      MCP_SERVERS: '{"s":{"url":"nope","headers":{"authorization":"Bearer hunter2"}}}',
    });
    expect(problems.join('\n')).not.toMatch(/too-short-hmac|hunter2/);
    expect(problems.map((line) => line.split(':')[0])).toEqual([
      'MCP_SERVERS',
      'AGENT_HTTP_SECRET',
    ]);
  });
});
