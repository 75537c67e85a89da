// Usage (docs/protocol.md "Usage and budgets"): every model request of the llm
// agent, against the fake model server with LLM_PRICES, is recorded per
// tenant, user, model, conversation and day, and `GET /api/usage` shows a
// user its own, an admin its tenant's, and a stranger nothing, on a cluster
// of two gateways and two workers.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeModelServer, openAiStream } from '../fakes/fake-model-server.js';
import { api, devToken } from '../support/clients.js';
import { startCluster, type TestCluster } from '../support/cluster.js';
import { uniqueName } from '../support/services.js';
import { useTestRedis } from '../support/test-redis.js';

useTestRedis();

/** USD per 1M tokens: a request of 1,000 prompt and 100 completion tokens costs 0.0012. */
const PRICES = { 'fake-model': { input: 1, output: 2 } };
const REQUEST_COST = 0.0012;

let model: FakeModelServer;
let cluster: TestCluster;

beforeAll(async () => {
  model = await FakeModelServer.start();
  model.always({
    kind: 'stream',
    events: openAiStream({
      text: ['an answer'],
      usage: { prompt_tokens: 1000, completion_tokens: 100 },
    }),
  });
  cluster = await startCluster({
    gateways: 2,
    workers: 2,
    env: {
      MAX_CONCURRENT_CONVERSATIONS: '20',
      LLM_BASE_URL: `${model.url}/v1`,
      LLM_API_KEY: 'sk-usage-e2e',
      LLM_MODEL: 'fake-model',
      LLM_PRICES: JSON.stringify(PRICES),
    },
  });
});

afterAll(async () => {
  await cluster?.close();
  await model?.close();
});

const today = () => new Date().toISOString().slice(0, 10);

/** One answered message of `token`'s user in a new llm conversation; returns its id. */
async function spend(token: string, url: string): Promise<string> {
  const created = await api(url, 'POST', '/api/conversations', {
    token,
    body: { agent: 'llm', title: 'fixed' },
  });
  expect(created.status).toBe(201);
  const id = created.body.conversation_id as string;
  const sent = await api(url, 'POST', `/api/conversations/${id}/events`, {
    token,
    body: { action: 'message', args: { content: 'hello' } },
    headers: { prefer: 'wait=30' },
  });
  expect(sent.body.turn?.agent_state).toBe('awaiting_user_input');
  return id;
}

function usage(url: string, token: string, query: string) {
  return api(url, 'GET', `/api/usage?${query}`, { token });
}

describe('GET /api/usage', () => {
  it('shows a user its own usage, an admin its tenant\u2019s, and a stranger none', async () => {
    const [first, second] = cluster.gateways.map((g) => g.url) as [string, string];
    const alice = uniqueName('alice');
    const bob = uniqueName('bob');
    const aliceToken = await cluster.token(alice);
    const bobToken = await cluster.token(bob);
    const admin = await devToken(first, {
      user_id: uniqueName('admin'),
      tenant_id: cluster.tenant,
      roles: ['admin'],
    });
    const strangerAdmin = await devToken(first, {
      user_id: alice,
      tenant_id: uniqueName('other-tenant'),
      roles: ['admin'],
    });
    const aliceFirst = await spend(aliceToken, first);
    const aliceSecond = await spend(aliceToken, second);
    await spend(bobToken, second);
    const days = `from=${today()}&to=${today()}`;

    const own = await usage(second, aliceToken, `${days}&group_by=conversation`);
    expect(own.status).toBe(200);
    expect(own.body.results.map((row: { key: string }) => row.key).sort()).toEqual(
      [aliceFirst, aliceSecond].sort(),
    );
    expect(own.body.total).toMatchObject({
      prompt_tokens: 2000,
      completion_tokens: 200,
      requests: 2,
    });
    expect(own.body.total.cost_usd).toBeCloseTo(2 * REQUEST_COST, 9);
    // Asking for oneself is the same; for another user, nothing exists.
    const self = await usage(first, aliceToken, `${days}&group_by=model&user_id=${alice}`);
    expect(self.body.results).toEqual([{ key: 'fake-model', ...own.body.total }]);
    expect((await usage(first, aliceToken, `${days}&user_id=${bob}`)).status).toBe(404);

    const tenant = await usage(first, admin, `${days}&group_by=user`);
    expect(
      tenant.body.results.map((row: { key: string; requests: number }) => [row.key, row.requests]),
    ).toEqual(
      [
        [alice, 2],
        [bob, 1],
      ].sort(),
    );
    const picked = await usage(first, admin, `${days}&group_by=day&user_id=${bob}`);
    expect(picked.body.results).toHaveLength(1);
    expect(picked.body.results[0]).toMatchObject({ key: today(), requests: 1 });

    const stranger = await usage(first, strangerAdmin, `${days}&group_by=user`);
    expect(stranger.status).toBe(200);
    expect(stranger.body.results).toEqual([]);
    expect(stranger.body.total.requests).toBe(0);
  });

  it('refuses bad dates, a from after to and an unknown group_by, naming the field', async () => {
    const url = cluster.gateways[0]!.url;
    const token = await cluster.token(uniqueName('user'));
    const cases: Array<[string, string]> = [
      ['from=2026-13-01&to=2026-12-31', 'from'],
      ['from=2026-02-30&to=2026-03-01', 'from'],
      ['from=2026-01-01&to=yesterday', 'to'],
      ['from=2026-01-01', 'to'],
      ['from=2026-02-01&to=2026-01-01', 'from'],
      ['from=2026-01-01&to=2026-01-31&group_by=week', 'group_by'],
      ['from=2026-01-01&from=2026-01-02&to=2026-01-31', 'from'],
    ];
    for (const [query, field] of cases) {
      const answer = await usage(url, token, query);
      expect(answer.status, query).toBe(400);
      expect(answer.body.error, query).toMatchObject({ code: 'BAD_REQUEST', field });
    }
    expect((await api(url, 'GET', '/api/usage?from=2026-01-01&to=2026-01-31')).status).toBe(401);
  });
});
