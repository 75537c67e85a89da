// Budgets against the fake model server (docs/protocol.md "Usage and budgets"):
// prices that make each request cost its worst case (1 USD: 100 output tokens
// at 10,000 USD per million, input free), a user's day of 5.5 USD and a
// tenant's month of 7.5 USD; the scenario of 20 concurrent turns of one user
// of which 5 reach the model. Used by budgets.e2e-spec.ts (the standalone app)
// and budgets-cluster.e2e-spec.ts.
import { expect } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { FakeModelServer, openAiStream } from '../fakes/fake-model-server.js';
import { api } from './clients.js';
import { metricSample } from './metrics.js';

export const BUDGET_ENV = {
  MAX_CONCURRENT_CONVERSATIONS: '50',
  LLM_API_KEY: 'sk-budgets-e2e',
  LLM_MODEL: 'fake-model',
  LLM_MAX_OUTPUT_TOKENS: '100',
  LLM_PRICES: JSON.stringify({ 'fake-model': { input: 0, output: 10_000 } }),
  LLM_MAX_RETRIES: '0',
  USER_BUDGET_USD_PER_DAY: '5.5',
  TENANT_BUDGET_USD_PER_MONTH: '7.5',
};

export function fakeModel(): Promise<FakeModelServer> {
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
export async function turnOf(url: string, token: string): Promise<Turn> {
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

export function refusal(turn: Turn): { reason: unknown; message: string } | undefined {
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
export async function expectFiveOfTwenty(
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

export const today = () => new Date().toISOString().slice(0, 10);
const tomorrow = () => new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
