// Budgets (docs/protocol.md "Usage and budgets") on two gateways and two
// workers: each model request's worst case is held before it is sent, across
// every worker at once (Redis scripts), so 20 concurrent turns of one user
// against a budget of 5.5 USD a day send 5 requests to the model. The spent
// base survives the loss of the Redis hash (it is read again from the usage
// table), and a tenant's monthly budget refuses another user of the tenant.
// Run on one Redis and again on a Redis Cluster.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FakeModelServer } from '../fakes/fake-model-server.js';
import {
  BUDGET_ENV,
  expectFiveOfTwenty,
  fakeModel,
  refusal,
  today,
  turnOf,
} from '../support/budgets.js';
import { startCluster, type TestCluster } from '../support/cluster.js';
import { uniqueName } from '../support/services.js';
import { openTestRedis, useTestRedis } from '../support/test-redis.js';

useTestRedis();

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
