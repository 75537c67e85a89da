// Budgets (docs/protocol.md "Usage and budgets"): each model request's worst case
// is held before it is sent, across every worker at once. Against the fake
// model server, with prices that make each request cost its worst case (1
// USD: 100 output tokens at 10,000 USD per million, input free), 20
// concurrent turns of one user against a budget of 5.5 USD a day send 5
// requests to the model, and the 15 others end in `error` (`budget_exhausted`)
// without reaching it; on two gateways and two workers (Redis scripts) and on
// the standalone app (in-process ledger). The spent base survives the loss of
// the Redis hash (it is read again from the usage table), and a tenant's
// monthly budget refuses another user of the tenant.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { FakeModelServer, openAiStream } from '../fakes/fake-model-server.js';
import { api } from '../support/clients.js';
import { startCluster, type TestCluster } from '../support/cluster.js';
import { metricSample } from '../support/metrics.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { signFor } from '../support/agent-runtime.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';
import { openTestRedis, useTestRedis } from '../support/test-redis.js';

useTestRedis();

const SECRET = 'budgets-e2e-secret-0123456789abcdef-0123';
const BUDGET_ENV = {
  MAX_CONCURRENT_CONVERSATIONS: '50',
  LLM_API_KEY: 'sk-budgets-e2e',
  LLM_MODEL: 'fake-model',
  LLM_MAX_OUTPUT_TOKENS: '100',
  LLM_PRICES: JSON.stringify({ 'fake-model': { input: 0, output: 10_000 } }),
  LLM_MAX_RETRIES: '0',
  USER_BUDGET_USD_PER_DAY: '5.5',
  TENANT_BUDGET_USD_PER_MONTH: '7.5',
};

function fakeModel(): Promise<FakeModelServer> {
  return FakeModelServer.start().then((model) =>
    model.always({
      kind: 'stream',
      delayMs: 20,
      events: openAiStream({
        text: ['within budget'],
        usage: { prompt_tokens: 10, completion_tokens: 100 },
      }),
    }),
  );
}

interface Turn {
  agent_state: string;
  events: StoredEvent[];
}

/** One message in a new llm conversation, answered before the response: its turn. */
async function turnOf(url: string, token: string): Promise<Turn> {
  const created = await api(url, 'POST', '/api/conversations', {
    token,
    body: { agent: 'llm', title: 'fixed' },
  });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  const sent = await api(url, 'POST', `/api/conversations/${created.body.conversation_id}/events`, {
    token,
    body: { action: 'message', args: { content: 'spend' } },
    headers: { prefer: 'wait=60' },
  });
  expect(sent.status).toBe(201);
  expect(sent.body.turn, 'the turn ended within the wait').not.toBeNull();
  return sent.body.turn as Turn;
}

function refusal(turn: Turn): { reason: unknown; message: string } | undefined {
  const error = turn.events.find(
    (e) =>
      'observation' in e &&
      e.observation === 'agent_state_changed' &&
      e.extras['agent_state'] === 'error',
  );
  return error && 'extras' in error
    ? { reason: error.extras['reason'], message: error.message }
    : undefined;
}

async function rejections(urls: readonly string[]): Promise<number> {
  let total = 0;
  for (const url of urls) {
    const text = await (await fetch(`${url}/metrics`)).text();
    total += metricSample(text, 'cs_budget_rejections_total') ?? 0;
  }
  return total;
}

/** 20 turns of one user at once against a budget that fits 5: 5 reach the model. */
async function expectFiveOfTwenty(
  urls: readonly string[],
  token: string,
  model: FakeModelServer,
  metricUrls: readonly string[],
): Promise<void> {
  const before = model.requests.length;
  const turns = await Promise.all(
    Array.from({ length: 20 }, (_, i) => turnOf(urls[i % urls.length]!, token)),
  );
  expect(model.requests.length - before).toBe(5);
  const answered = turns.filter((turn) => turn.agent_state === 'awaiting_user_input');
  const refused = turns.filter((turn) => turn.agent_state === 'error');
  expect(answered).toHaveLength(5);
  expect(refused).toHaveLength(15);
  for (const turn of refused) {
    const why = refusal(turn);
    expect(why?.reason).toBe('budget_exhausted');
    expect(why?.message).toMatch(/daily model budget \(USD 5\.5 per UTC day\)/);
    expect(why?.message).toContain(`renews at ${tomorrow()}T00:00:00.000Z`);
  }
  expect(await rejections(metricUrls)).toBe(15);
}

const today = () => new Date().toISOString().slice(0, 10);
const tomorrow = () => new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);

describe('budgets on two gateways and two workers', () => {
  let model: FakeModelServer;
  let cluster: TestCluster;

  beforeAll(async () => {
    model = await fakeModel();
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: { ...BUDGET_ENV, LLM_BASE_URL: `${model.url}/v1` },
    });
  });

  afterAll(async () => {
    await cluster?.close();
    await model?.close();
  });

  it('sends 5 of 20 concurrent requests of one user, keeps the spent base when Redis loses it, and holds the tenant to its month', async () => {
    const urls = cluster.gateways.map((g) => g.url);
    const user = uniqueName('spender');
    const token = await cluster.token(user);
    await expectFiveOfTwenty(
      urls,
      token,
      model,
      cluster.workers.map((w) => w.url),
    );

    // The user's day hash is gone (a Redis that lost its data): the base comes from Postgres.
    const redis = openTestRedis();
    try {
      const key = `${cluster.prefix}:user:{${encodeURIComponent(cluster.tenant)}/${encodeURIComponent(user)}}:budget:${today()}`;
      expect(await redis.exists(key)).toBe(1);
      await redis.del(key);
    } finally {
      redis.disconnect();
    }
    const before = model.requests.length;
    expect(refusal(await turnOf(urls[1]!, token))?.reason).toBe('budget_exhausted');
    expect(model.requests.length).toBe(before);

    // The tenant has 7.5 a month: 5 spent, another user gets 2 requests, then none.
    const other = await cluster.token(uniqueName('colleague'));
    expect((await turnOf(urls[0]!, other)).agent_state).toBe('awaiting_user_input');
    expect((await turnOf(urls[1]!, other)).agent_state).toBe('awaiting_user_input');
    const third = refusal(await turnOf(urls[0]!, other));
    expect(third?.reason).toBe('budget_exhausted');
    expect(third?.message).toMatch(
      /organization's monthly model budget \(USD 7\.5 per UTC month\)/,
    );
    expect(model.requests.length).toBe(before + 2);
  });
});

describe('budgets on the standalone app', () => {
  let model: FakeModelServer;
  let db: ScratchDatabase;
  let app: AppProcess;

  beforeAll(async () => {
    model = await fakeModel();
    db = await createScratchDatabase('cs_budgets', { migrated: true });
    app = await startApp('standalone', {
      ...BUDGET_ENV,
      LLM_BASE_URL: `${model.url}/v1`,
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
    await model?.close();
  });

  it('sends 5 of 20 concurrent requests of one user', async () => {
    const token = await signFor(SECRET, uniqueName('spender'), uniqueName('tenant'));
    await expectFiveOfTwenty([app.url], token, model, [app.url]);
  });
});
