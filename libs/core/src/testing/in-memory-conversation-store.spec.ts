import { describe, expect, it } from 'vitest';
import type { EventDraft, NewConversation } from '../conversation.js';
import { AgentBusyError, ConflictError, LeaseLostError, NotFoundError } from '../errors.js';
import { InMemoryConversationStore } from './in-memory-conversation-store.js';
import { ManualClock } from './manual-clock.js';

const T = 'tenant-1';

function newConversation(id: string, userId = 'u-1', tenantId = T): NewConversation {
  return {
    id,
    tenantId,
    userId,
    appName: 'app',
    title: id,
    metadata: {},
    agent: { name: 'echo', config: {} },
    instructions: null,
  };
}

const userMessage = (content: string, clientEventId?: string): EventDraft => ({
  source: 'user',
  body: { action: 'message', args: { content }, message: content },
  ...(clientEventId === undefined ? {} : { clientEventId }),
});

describe(InMemoryConversationStore.name, () => {
  it('refuses a message under reject while another waits for its answer, and answers a repeat', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c'));
    const refuse = { defaultMultitaskStrategy: 'reject' } as const;
    const results = await Promise.allSettled(
      ['a', 'b', 'c'].map((text) => store.append(T, 'c', [userMessage(text, text)], refuse)),
    );
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'rejected']);
    expect(results[1]).toMatchObject({ reason: expect.any(AgentBusyError) as unknown });
    const [repeat] = await store.append(T, 'c', [userMessage('a', 'a')], refuse);
    expect(repeat).toMatchObject({ duplicate: true, event: { id: 0 } });
    await store.append(T, 'c', [
      {
        source: 'environment',
        cause: 0,
        answers: 0,
        body: {
          observation: 'agent_state_changed',
          content: '',
          extras: { agent_state: 'awaiting_user_input' },
          message: '',
        },
      },
    ]);
    expect(await store.append(T, 'c', [userMessage('d')], refuse)).toHaveLength(1);
  });

  it('records model usage of appends and title updates, and reports it by group for one tenant', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c-1', 'alice'));
    await store.createConversation(newConversation('c-2', 'bob'));
    await store.createConversation(newConversation('c-3', 'alice', 'tenant-2'));
    const usage = (model: string, costUsd: number) => ({
      model,
      promptTokens: 10,
      completionTokens: 2,
      costUsd,
      requests: 1,
    });
    const step = (model: string, cost: number): EventDraft => ({
      source: 'agent',
      body: { action: 'message', args: { content: 'a' }, message: 'a' },
      usage: usage(model, cost),
    });
    await store.append(T, 'c-1', [step('m1', 1), step('m2', 2)]);
    await store.append(T, 'c-2', [step('m1', 4)]);
    await store.append('tenant-2', 'c-3', [step('m1', 8)]);
    await store.updateConversation(T, 'c-1', { addUsage: usage('m1', 0.5) });
    const today = new Date().toISOString().slice(0, 10);
    const byModel = await store.usageReport(T, { from: today, to: today, groupBy: 'model' });
    expect(byModel.results.map((r) => [r.key, r.cost_usd, r.requests])).toEqual([
      ['m1', 5.5, 3],
      ['m2', 2, 1],
    ]);
    expect(byModel.total).toEqual({
      prompt_tokens: 40,
      completion_tokens: 8,
      cost_usd: 7.5,
      requests: 4,
    });
    expect(await store.usageCost(T, { from: today, to: today, userId: 'alice' })).toBe(3.5);
    expect(await store.usageCost(T, { from: '2000-01-01', to: '2000-01-01' })).toBe(0);
  });

  it('appends with gap-free ids from 0 and keeps last_event_id in step', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c'));
    const first = await store.append(T, 'c', [userMessage('a'), userMessage('b')]);
    const second = await store.append(T, 'c', [userMessage('c')]);
    expect([...first, ...second].map((a) => a.event.id)).toEqual([0, 1, 2]);
    expect((await store.getConversation(T, 'c'))?.lastEventId).toBe(2);
    expect((await store.readEvents(T, 'c', { limit: 10 })).map((e) => e.id)).toEqual([0, 1, 2]);
    expect(
      (await store.readEvents(T, 'c', { fromId: 1, toId: 1, limit: 10 })).map((e) => e.id),
    ).toEqual([1]);
    expect((await store.readEvents(T, 'c', { reverse: true, limit: 2 })).map((e) => e.id)).toEqual([
      2, 1,
    ]);
  });

  it('is idempotent by clientEventId and refuses the same key with other content', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c'));
    const [first] = await store.append(T, 'c', [userMessage('hi', 'k')]);
    const [again] = await store.append(T, 'c', [userMessage('hi', 'k')]);
    expect(first?.event).toMatchObject({ client_event_id: 'k' });
    expect(again).toEqual({ event: first?.event, duplicate: true });
    await expect(store.append(T, 'c', [userMessage('other', 'k')])).rejects.toBeInstanceOf(
      ConflictError,
    );
    expect(await store.readEvents(T, 'c', { limit: 10 })).toHaveLength(1);
  });

  it('fences writers with a stale lease epoch and records the epoch of each event', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c'));
    const old = await store.acquireLease(T, 'c', 'w-1');
    const current = await store.acquireLease(T, 'c', 'w-2');
    const stale = store.append(T, 'c', [userMessage('x')], { leaseEpoch: old });
    await expect(stale).rejects.toBeInstanceOf(LeaseLostError);
    await store.append(T, 'c', [userMessage('y')], { leaseEpoch: current });
    await store.append(T, 'c', [userMessage('z')]);
    expect(store.leaseEpochs('c')).toEqual([current, null]);
    expect((await store.getConversation(T, 'c'))?.leaseOwner).toBe('w-2');
  });

  it('merges state deltas by scope, drops temp: keys, deletes on null, tracks agent_state and metrics', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c1'));
    await store.createConversation(newConversation('c2'));
    await store.append(T, 'c1', [
      {
        source: 'agent',
        body: {
          observation: 'agent_state_changed',
          content: '',
          extras: { agent_state: 'running' },
          message: '',
        },
        stateDelta: { 'app:a': 1, 'user:u': 2, k: 3, gone: 4, 'temp:t': 5 },
        metricsDelta: { iterations: 1, prompt_tokens: 10 },
      },
    ]);
    await store.append(T, 'c1', [{ ...userMessage('m'), stateDelta: { gone: null } }]);
    const c1 = await store.getSnapshot(T, 'c1');
    expect(c1?.state).toEqual({ 'app:a': 1, 'user:u': 2, k: 3 });
    expect(c1?.conversation.agentState).toBe('running');
    expect(c1?.conversation.metrics).toMatchObject({ iterations: 1, prompt_tokens: 10 });
    // app: and user: keys are shared with the user's other conversations.
    expect((await store.getSnapshot(T, 'c2'))?.state).toEqual({ 'app:a': 1, 'user:u': 2 });
  });

  it('scopes everything by tenant', async () => {
    const store = new InMemoryConversationStore();
    await store.createConversation(newConversation('c', 'u-1', 'other-tenant'));
    expect(await store.getConversation(T, 'c')).toBeNull();
    expect(await store.readEvents(T, 'c', { limit: 10 })).toEqual([]);
    await expect(store.append(T, 'c', [userMessage('x')])).rejects.toBeInstanceOf(NotFoundError);
    await expect(store.createConversation(newConversation('c'))).rejects.toBeInstanceOf(
      ConflictError,
    );
    expect((await store.listConversations(T, { limit: 10 })).items).toEqual([]);
  });

  it('lists by latest activity with keyset pagination', async () => {
    const clock = new ManualClock();
    const store = new InMemoryConversationStore({ clock });
    for (const id of ['a', 'b', 'c']) {
      await store.createConversation(newConversation(id));
      clock.advance(1000);
    }
    await store.append(T, 'a', [userMessage('bump')]);
    const page1 = await store.listConversations(T, { limit: 2 });
    expect(page1.items.map((r) => r.id)).toEqual(['a', 'c']);
    const page2 = await store.listConversations(T, { limit: 2, cursor: page1.nextCursor! });
    expect(page2.items.map((r) => r.id)).toEqual(['b']);
    expect(page2.nextCursor).toBeNull();
  });
});
