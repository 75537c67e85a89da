// The behaviour every ConversationStore must have: the Postgres store (on
// Postgres, through PgBouncer, and on PGlite) and the in-memory store of unit
// tests run these same cases. Each implementation's runner supplies a fixture
// and calls `conversationStoreContract`; the cases below know nothing of SQL.
// What only a SQL store can show (statement counts, row versions, columns)
// is in store.int-spec.ts.
import { randomUUID } from 'node:crypto';
import type { ConversationStore, EventDraft, NewConversation } from '@cs/core';
import {
  AgentBusyError,
  BadRequestError,
  ConflictError,
  DEFAULT_SETTINGS,
  LeaseLostError,
  NotFoundError,
} from '@cs/core';
import type { ConversationStatus } from '@cs/protocol';
// The codec alone, not all of @cs/store: the unit project loads this file too.
import { decodeCursor } from '../../libs/store/src/conversation-page.cursor.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';

/** What an implementation provides to the contract. */
export interface ConversationStoreFixture {
  /** The store under test; each case uses tenants of its own. */
  store: ConversationStore;
  /** How many events of the conversation are stored, whatever their tenant. */
  countEvents(conversationId: string): Promise<number>;
  /** The lease epoch each stored event was written under (null: none), in id order. */
  leaseEpochs(conversationId: string): Promise<(number | null)[]>;
  teardown(): Promise<void>;
}

export function newConversation(overrides: Partial<NewConversation> = {}): NewConversation {
  return {
    id: randomUUID(),
    tenantId: uniqueName('tenant'),
    userId: 'alice',
    appName: 'chat',
    title: 'a conversation',
    metadata: { topic: 'tests' },
    agent: { name: 'echo', config: {} },
    instructions: null,
    ...overrides,
  };
}

export function message(content: string, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'user',
    body: { action: 'message', args: { content, image_urls: [], file_urls: [] }, message: content },
    ...extra,
  };
}

export function agentStateChanged(agentState: string, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'environment',
    body: {
      observation: 'agent_state_changed',
      content: '',
      extras: { agent_state: agentState },
      message: `agent state is ${agentState}`,
    },
    ...extra,
  };
}

/** A step's stored tool call for the turn of `cause`, carrying the step's usage. */
export function step(cause: number, costUsd: number, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'agent',
    body: {
      action: 'tool_call',
      args: { tool: 'current_time', arguments: {}, tool_call_id: `call_${randomUUID()}` },
      message: '',
    },
    cause,
    metricsDelta: { iterations: 1, prompt_tokens: 10, completion_tokens: 5, cost_usd: costUsd },
    ...extra,
  };
}

export function conversationStoreContract(
  name: string,
  makeFixture: () => Promise<ConversationStoreFixture>,
): void {
  describe(`ConversationStore contract: ${name}`, () => {
    let fixture: ConversationStoreFixture;
    let store: ConversationStore;

    beforeAll(async () => {
      fixture = await makeFixture();
      ({ store } = fixture);
    });

    afterAll(async () => {
      await fixture?.teardown();
    });

    async function created(overrides: Partial<NewConversation> = {}) {
      return (await store.createConversation(newConversation(overrides))).conversation;
    }

    describe('createConversation', () => {
      it('creates a new conversation with the defaults of PROTOCOL.md', async () => {
        const input = newConversation({ instructions: 'be brief' });
        const { conversation, created: isNew } = await store.createConversation(input);
        expect(isNew).toBe(true);
        expect(conversation).toMatchObject({
          id: input.id,
          tenantId: input.tenantId,
          userId: 'alice',
          appName: 'chat',
          title: 'a conversation',
          metadata: { topic: 'tests' },
          agent: { name: 'echo', config: {} },
          instructions: 'be brief',
          status: 'STOPPED',
          agentState: null,
          lastEventId: -1,
          leaseEpoch: 0,
          leaseOwner: null,
          metrics: { iterations: 0, prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 },
        });
        expect(conversation).toMatchObject({
          settings: DEFAULT_SETTINGS,
          turnCost: null,
          answeredThrough: -1,
        });
        expect(conversation.incarnation).toMatch(/^[0-9a-f-]{36}$/);
        expect(conversation.createdAt).toBeInstanceOf(Date);
        expect(conversation.updatedAt).toEqual(conversation.createdAt);
        expect(await store.getConversation(input.tenantId, input.id)).toEqual(conversation);
      });

      it('stores the settings it is given', async () => {
        const settings = {
          confirmationMode: true,
          multitaskStrategy: 'reject' as const,
          maxIterations: 7,
          maxBudgetUsd: 0.5,
        };
        const input = newConversation({ settings });
        const { conversation } = await store.createConversation(input);
        expect(conversation.settings).toEqual(settings);
        expect((await store.getConversation(input.tenantId, input.id))?.settings).toEqual(settings);
        const updated = await store.updateConversation(input.tenantId, input.id, {
          confirmationMode: false,
          multitaskStrategy: 'enqueue',
        });
        expect(updated?.settings).toEqual({
          ...settings,
          confirmationMode: false,
          multitaskStrategy: 'enqueue',
        });
      });

      it('returns the stored conversation when its owner repeats the id', async () => {
        const input = newConversation();
        const first = await store.createConversation(input);
        const again = await store.createConversation({ ...input, title: 'other title' });
        expect(again.created).toBe(false);
        expect(again.conversation).toEqual(first.conversation);
      });

      it('refuses an id owned by another user or another tenant', async () => {
        const input = newConversation();
        await store.createConversation(input);
        await expect(store.createConversation({ ...input, userId: 'bob' })).rejects.toBeInstanceOf(
          ConflictError,
        );
        const otherTenant = uniqueName('tenant');
        await expect(
          store.createConversation({ ...input, tenantId: otherTenant }),
        ).rejects.toBeInstanceOf(ConflictError);
        expect(await store.getConversation(otherTenant, input.id)).toBeNull();
      });

      it('stores a conversation with its first events, all of it or none', async () => {
        const input = newConversation();
        const { conversation } = await store.createConversation(input, [
          message('hello', { clientEventId: 'first', stateDelta: { greeted: true } }),
        ]);
        expect(conversation).toMatchObject({ lastEventId: 0 });
        const snapshot = await store.getSnapshot(input.tenantId, input.id);
        expect(snapshot).toMatchObject({
          conversation: { lastEventId: 0 },
          state: { greeted: true },
        });
        expect(await store.readEvents(input.tenantId, input.id, { limit: 10 })).toMatchObject([
          { id: 0, client_event_id: 'first', message: 'hello' },
        ]);
        // A draft the log refuses stores no conversation either.
        const refused = newConversation();
        await expect(
          store.createConversation(refused, [message('fine'), agentStateChanged('dancing')]),
        ).rejects.toBeInstanceOf(BadRequestError);
        expect(await store.getConversation(refused.tenantId, refused.id)).toBeNull();
        expect(await fixture.countEvents(refused.id)).toBe(0);
      });

      it('names a conversation by its id in either case, and keeps the id in lower case', async () => {
        const input = newConversation({ id: randomUUID().toUpperCase() });
        const id = input.id.toLowerCase();
        const { conversation } = await store.createConversation(input);
        expect(conversation.id).toBe(id);
        expect(await store.createConversation({ ...input, id })).toMatchObject({ created: false });
        expect((await store.getConversation(input.tenantId, input.id))?.id).toBe(id);
        await store.append(input.tenantId, input.id, [message('upper')]);
        expect(await store.readEvents(input.tenantId, id, { limit: 10 })).toHaveLength(1);
        expect(
          await store.lastEventIds([{ tenantId: input.tenantId, conversationId: input.id }]),
        ).toEqual(new Map([[id, 0]]));
        expect(await store.deleteConversation(input.tenantId, input.id)).toBe(true);
        expect(await store.getConversation(input.tenantId, id)).toBeNull();
      });

      it('refuses an id that is not a UUID', async () => {
        await expect(
          store.createConversation(newConversation({ id: 'not-a-uuid' })),
        ).rejects.toBeInstanceOf(BadRequestError);
      });
    });

    describe('append', () => {
      it('gives 20 concurrent appends to one conversation the ids 0..19', async () => {
        const conversation = await created();
        const results = await Promise.all(
          Array.from({ length: 20 }, (_, i) =>
            store.append(conversation.tenantId, conversation.id, [message(`hello ${i}`)]),
          ),
        );
        const ids = results.map((appended) => appended[0]!.event.id).sort((a, b) => a - b);
        expect(ids).toEqual(Array.from({ length: 20 }, (_, i) => i));
        const stored = await store.readEvents(conversation.tenantId, conversation.id, {
          limit: 100,
        });
        expect(stored.map((event) => event.id)).toEqual(ids);
        // Each stored event is the one its append returned.
        for (const [appended] of results) {
          expect(stored[appended!.event.id]).toEqual(appended!.event);
        }
        const after = await store.getConversation(conversation.tenantId, conversation.id);
        expect(after?.lastEventId).toBe(19);
      });

      it('takes one of many messages sent at once under reject, refuses the others, and answers a repeat', async () => {
        const conversation = await created();
        const refuse = { defaultMultitaskStrategy: 'reject' } as const;
        const results = await Promise.allSettled(
          Array.from({ length: 10 }, (_, i) =>
            store.append(
              conversation.tenantId,
              conversation.id,
              [message(`at once ${i}`, { clientEventId: `key-${i}` })],
              refuse,
            ),
          ),
        );
        const taken = results.filter((result) => result.status === 'fulfilled');
        expect(taken).toHaveLength(1);
        for (const result of results)
          if (result.status === 'rejected') expect(result.reason).toBeInstanceOf(AgentBusyError);
        const stored = await store.readEvents(conversation.tenantId, conversation.id, {
          limit: 100,
        });
        expect(stored).toHaveLength(1);
        // The taken message's repeat is that event, not a refusal.
        const key = (stored[0] as { client_event_id?: string }).client_event_id!;
        const content = key.replace('key-', 'at once ');
        const [repeat] = await store.append(
          conversation.tenantId,
          conversation.id,
          [message(content, { clientEventId: key })],
          refuse,
        );
        expect(repeat).toMatchObject({ duplicate: true, event: { id: stored[0]!.id } });
        // Once it is answered the agent is free, until a turn runs.
        await store.append(conversation.tenantId, conversation.id, [
          agentStateChanged('awaiting_user_input', { cause: 0, answers: 0 }),
        ]);
        await store.append(conversation.tenantId, conversation.id, [message('next')], refuse);
        await store.append(conversation.tenantId, conversation.id, [
          agentStateChanged('running', { cause: 2 }),
        ]);
        await expect(
          store.append(conversation.tenantId, conversation.id, [message('while running')], refuse),
        ).rejects.toBeInstanceOf(AgentBusyError);
        // Under enqueue or interrupt messages are always stored.
        await store.append(conversation.tenantId, conversation.id, [message('queued')]);
        expect(
          await store.readEvents(conversation.tenantId, conversation.id, { limit: 100 }),
        ).toHaveLength(5);
      });

      it("decides by the conversation's own strategy as stored when the message is, over the deployment's", async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        const enqueue = { defaultMultitaskStrategy: 'enqueue' } as const;
        await store.append(tenantId, id, [message('first')], enqueue);
        await store.append(tenantId, id, [agentStateChanged('running', { cause: 0 })]);
        // The deployment enqueues; the conversation was set to reject since.
        await store.updateConversation(tenantId, id, { multitaskStrategy: 'reject' });
        await expect(
          store.append(tenantId, id, [message('while running')], enqueue),
        ).rejects.toBeInstanceOf(AgentBusyError);
        // And back to enqueue, under a deployment that rejects.
        await store.updateConversation(tenantId, id, { multitaskStrategy: 'enqueue' });
        const [queued] = await store.append(tenantId, id, [message('queued')], {
          defaultMultitaskStrategy: 'reject',
        });
        expect(queued).toMatchObject({ duplicate: false });
        expect(await store.readEvents(tenantId, id, { limit: 100 })).toHaveLength(3);
      });

      it('under reject, takes one reply to tool calls awaiting approval and refuses a second', async () => {
        const conversation = await created();
        const refuse = { defaultMultitaskStrategy: 'reject' } as const;
        const { tenantId, id } = conversation;
        await store.append(tenantId, id, [message('what time is it?')], refuse);
        await store.append(tenantId, id, [
          agentStateChanged('running', { cause: 0 }),
          step(0, 0),
          agentStateChanged('awaiting_user_confirmation', { cause: 0 }),
        ]);
        // The pending turn's message is unanswered, yet a reply is taken: it rejects the calls.
        const [reply] = await store.append(tenantId, id, [message('never mind')], refuse);
        expect(reply).toMatchObject({ duplicate: false, event: { id: 4 } });
        await expect(
          store.append(tenantId, id, [message('and another')], refuse),
        ).rejects.toBeInstanceOf(AgentBusyError);
        expect(await store.readEvents(tenantId, id, { limit: 100 })).toHaveLength(5);
      });

      it('appends a batch with consecutive ids, one timestamp and summed metrics', async () => {
        const conversation = await created();
        await store.append(conversation.tenantId, conversation.id, [message('first')]);
        const drafts: EventDraft[] = Array.from({ length: 5 }, (_, i) => ({
          source: 'agent',
          body: { action: 'message', args: { content: `answer ${i}` }, message: '' },
          cause: 0,
          metricsDelta: { iterations: 1, prompt_tokens: 10, completion_tokens: 5, cost_usd: 0.25 },
        }));
        const appended = await store.append(conversation.tenantId, conversation.id, drafts);
        expect(appended.map((a) => a.event.id)).toEqual([1, 2, 3, 4, 5]);
        expect(appended.every((a) => !a.duplicate)).toBe(true);
        expect(new Set(appended.map((a) => a.event.timestamp)).size).toBe(1);
        const stored = await store.readEvents(conversation.tenantId, conversation.id, {
          fromId: 1,
          limit: 100,
        });
        expect(stored).toEqual(appended.map((a) => a.event));
        const after = await store.getConversation(conversation.tenantId, conversation.id);
        expect(after?.lastEventId).toBe(5);
        expect(after?.metrics).toEqual({
          iterations: 5,
          prompt_tokens: 50,
          completion_tokens: 25,
          cost_usd: 1.25,
        });
        expect(after!.updatedAt.toISOString()).toBe(appended[0]!.event.timestamp);
      });

      it('returns events in the wire shape, with cause and client_event_id only when set', async () => {
        const conversation = await created();
        const [plain, caused] = await store.append(conversation.tenantId, conversation.id, [
          message('hi'),
          {
            source: 'agent',
            body: { action: 'message', args: { content: 'hello' }, message: 'hello' },
            cause: 0,
          },
        ]);
        const [keyed] = await store.append(conversation.tenantId, conversation.id, [
          message('again', { clientEventId: 'k-1' }),
        ]);
        expect(plain!.event).toEqual({
          id: 0,
          timestamp: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/) as unknown,
          source: 'user',
          action: 'message',
          args: { content: 'hi', image_urls: [], file_urls: [] },
          message: 'hi',
        });
        expect(caused!.event).toMatchObject({ id: 1, cause: 0, source: 'agent' });
        expect(keyed!.event).toMatchObject({ id: 2, client_event_id: 'k-1' });
        const stored = await store.readEvents(conversation.tenantId, conversation.id, {
          limit: 10,
        });
        expect(stored).toEqual([plain!.event, caused!.event, keyed!.event]);
        expect(Object.keys(stored[0]!)).not.toContain('cause');
        expect(Object.keys(stored[0]!)).not.toContain('client_event_id');
      });

      it('returns the stored event for a repeated client_event_id and refuses other content', async () => {
        const conversation = await created();
        // Characters that array literals and JSON both escape.
        const key = 'key "with" {braces}, commas\\ and ünïcode';
        const [first] = await store.append(conversation.tenantId, conversation.id, [
          message('hello', { clientEventId: key, stateDelta: { counter: 1 } }),
        ]);
        expect(first).toMatchObject({ duplicate: false, event: { id: 0, client_event_id: key } });

        const [again] = await store.append(conversation.tenantId, conversation.id, [
          message('hello', { clientEventId: key, stateDelta: { counter: 2 } }),
        ]);
        expect(again).toEqual({ duplicate: true, event: first!.event });

        await expect(
          store.append(conversation.tenantId, conversation.id, [
            message('something else', { clientEventId: key }),
          ]),
        ).rejects.toBeInstanceOf(ConflictError);
        // A conflict anywhere in a batch writes none of it.
        await expect(
          store.append(conversation.tenantId, conversation.id, [
            message('new one'),
            { ...message('hello', { clientEventId: key }), source: 'agent' },
          ]),
        ).rejects.toBeInstanceOf(ConflictError);

        expect(await fixture.countEvents(conversation.id)).toBe(1);
        const snapshot = await store.getSnapshot(conversation.tenantId, conversation.id);
        expect(snapshot?.conversation.lastEventId).toBe(0);
        expect(snapshot?.state).toEqual({ counter: 1 });
      });

      it('stores a key repeated within one batch once', async () => {
        const conversation = await created();
        const appended = await store.append(conversation.tenantId, conversation.id, [
          message('one', { clientEventId: 'a' }),
          message('two'),
          message('one', { clientEventId: 'a' }),
        ]);
        expect(appended.map((a) => [a.event.id, a.duplicate])).toEqual([
          [0, false],
          [1, false],
          [0, true],
        ]);
        await expect(
          store.append(conversation.tenantId, conversation.id, [
            message('x', { clientEventId: 'b' }),
            message('y', { clientEventId: 'b' }),
          ]),
        ).rejects.toBeInstanceOf(ConflictError);
        expect(await fixture.countEvents(conversation.id)).toBe(2);
      });

      it('stores one event when the same client_event_id arrives 10 times at once', async () => {
        const conversation = await created();
        const results = await Promise.all(
          Array.from({ length: 10 }, () =>
            store.append(conversation.tenantId, conversation.id, [
              message('once', { clientEventId: 'same' }),
            ]),
          ),
        );
        expect(results.filter(([a]) => !a!.duplicate)).toHaveLength(1);
        expect(new Set(results.map(([a]) => a!.event.id))).toEqual(new Set([0]));
        expect(await fixture.countEvents(conversation.id)).toBe(1);
      });

      it('merges state deltas by scope: temp: dropped, null deleting', async () => {
        const tenantId = uniqueName('tenant');
        const conversation = await created({ tenantId });
        const sibling = await created({ tenantId });
        const otherUser = await created({ tenantId, userId: 'bob' });
        const otherApp = await created({ tenantId, appName: 'other-app' });

        await store.append(tenantId, conversation.id, [
          message('one', {
            stateDelta: {
              topic: 'cats',
              count: 1,
              'user:name': 'Alice',
              'user:lang': 'en',
              'app:motd': 'hi',
              'temp:scratch': 'gone',
            },
          }),
        ]);
        await store.append(tenantId, conversation.id, [
          message('two', { stateDelta: { count: null, nested: { a: [1, 2] }, 'user:lang': null } }),
          message('three', { stateDelta: { nested: { b: true }, 'app:motd': 'hello' } }),
        ]);

        const snapshot = await store.getSnapshot(tenantId, conversation.id);
        expect(snapshot?.state).toEqual({
          topic: 'cats',
          nested: { b: true },
          'user:name': 'Alice',
          'app:motd': 'hello',
        });
        expect((await store.getSnapshot(tenantId, sibling.id))?.state).toEqual({
          'user:name': 'Alice',
          'app:motd': 'hello',
        });
        expect((await store.getSnapshot(tenantId, otherUser.id))?.state).toEqual({
          'app:motd': 'hello',
        });
        expect((await store.getSnapshot(tenantId, otherApp.id))?.state).toEqual({});

        // Nor is a temp: key kept in the user's or the app's shared state.
        expect(await store.getScopedState(tenantId, 'chat', 'alice')).toEqual({
          'user:name': 'Alice',
          'app:motd': 'hello',
        });
      });

      it("reads a user's app: and user: keys on their own, as a snapshot merges them", async () => {
        const tenantId = uniqueName('tenant');
        const conversation = await created({ tenantId });
        expect(await store.getScopedState(tenantId, 'chat', 'alice')).toEqual({});
        await store.append(tenantId, conversation.id, [
          message('one', { stateDelta: { own: 1, 'user:lang': 'en', 'app:motd': 'hi' } }),
        ]);
        await store.append(tenantId, (await created({ tenantId, userId: 'bob' })).id, [
          message('two', { stateDelta: { 'user:lang': 'fr', 'app:motd': 'hello' } }),
        ]);
        const scoped = await store.getScopedState(tenantId, 'chat', 'alice');
        expect(scoped).toEqual({ 'user:lang': 'en', 'app:motd': 'hello' });
        const { own: _own, ...shared } = (await store.getSnapshot(tenantId, conversation.id))!
          .state;
        expect(scoped).toEqual(shared);
        expect(await store.getScopedState(tenantId, 'other-app', 'alice')).toEqual({});
        expect(await store.getScopedState(uniqueName('tenant'), 'chat', 'alice')).toEqual({});
      });

      it('keeps every user: key when 20 conversations of one user append at once', async () => {
        const tenantId = uniqueName('tenant');
        const conversations = await Promise.all(
          Array.from({ length: 20 }, () => created({ tenantId })),
        );
        await Promise.all(
          conversations.map((conversation, i) =>
            store.append(tenantId, conversation.id, [
              message(`hi ${i}`, {
                stateDelta: { [`user:key_${i}`]: i, [`app:key_${i}`]: i, own: i },
              }),
            ]),
          ),
        );
        const snapshot = await store.getSnapshot(tenantId, conversations[0]!.id);
        for (let i = 0; i < 20; i += 1) {
          expect(snapshot?.state[`user:key_${i}`]).toBe(i);
          expect(snapshot?.state[`app:key_${i}`]).toBe(i);
        }
        expect(snapshot?.state.own).toBe(0);
      });

      it('refuses a stale lease epoch and writes nothing', async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        expect(await store.acquireLease(tenantId, id, 'worker-a')).toBe(1);
        const [written] = await store.append(tenantId, id, [agentStateChanged('running')], {
          leaseEpoch: 1,
        });
        expect(written!.event.id).toBe(0);

        expect(await store.acquireLease(tenantId, id, 'worker-b')).toBe(2);
        const stale = store.append(
          tenantId,
          id,
          [agentStateChanged('finished', { stateDelta: { late: true, 'user:late': true } })],
          { leaseEpoch: 1 },
        );
        await expect(stale).rejects.toBeInstanceOf(LeaseLostError);
        await expect(stale).rejects.toMatchObject({ epoch: 1, currentEpoch: 2 });

        const snapshot = await store.getSnapshot(tenantId, id);
        expect(snapshot?.conversation).toMatchObject({
          lastEventId: 0,
          agentState: 'running',
          leaseEpoch: 2,
          leaseOwner: 'worker-b',
        });
        expect(snapshot?.state).toEqual({});
        expect(await fixture.countEvents(id)).toBe(1);

        await store.append(tenantId, id, [message('user write, no lease')]);
        await store.append(tenantId, id, [agentStateChanged('awaiting_user_input')], {
          leaseEpoch: 2,
        });
        expect(await fixture.leaseEpochs(id)).toEqual([1, null, 2]);
      });

      it('keeps agent_state and last_event_id in step with the log', async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        await store.append(tenantId, id, [agentStateChanged('loading')]);
        expect(await store.getConversation(tenantId, id)).toMatchObject({
          agentState: 'loading',
          lastEventId: 0,
        });
        await store.append(tenantId, id, [
          agentStateChanged('running'),
          message('hi'),
          agentStateChanged('awaiting_user_input'),
          message('more'),
        ]);
        expect(await store.getConversation(tenantId, id)).toMatchObject({
          agentState: 'awaiting_user_input',
          lastEventId: 4,
        });
        await expect(
          store.append(tenantId, id, [message('x'), agentStateChanged('dancing')]),
        ).rejects.toBeInstanceOf(BadRequestError);
        expect(await store.getConversation(tenantId, id)).toMatchObject({
          agentState: 'awaiting_user_input',
          lastEventId: 4,
        });
        const [last] = await store.readEvents(tenantId, id, { reverse: true, limit: 1 });
        expect(last?.id).toBe(4);
      });

      it("counts each step's cost toward its turn, starts afresh for a new turn, and reads it back on restore", async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        expect(conversation.turnCost).toBeNull();
        const [first, second] = (
          await store.append(tenantId, id, [message('first'), message('second')])
        ).map((appended) => appended.event.id);
        const turnCost = async () => (await store.getConversation(tenantId, id))?.turnCost;

        // One statement each; an append without usage leaves the count alone.
        await store.append(tenantId, id, [step(first!, 0.3)]);
        await store.append(tenantId, id, [step(first!, 0.3), agentStateChanged('running')]);
        await store.append(tenantId, id, [agentStateChanged('running', { cause: first! })]);
        expect(await turnCost()).toEqual({ cause: first, costUsd: 0.6 });
        // In a transaction (a user: key takes one), and a repeat counted once.
        const inTransaction = step(first!, 0.25, {
          clientEventId: 'step-3',
          stateDelta: { 'user:seen': true },
        });
        await store.append(tenantId, id, [inTransaction]);
        await store.append(tenantId, id, [inTransaction]);
        expect(await turnCost()).toEqual({ cause: first, costUsd: 0.85 });

        await store.append(tenantId, id, [step(second!, 0.1)]);
        expect(await turnCost()).toEqual({ cause: second, costUsd: 0.1 });
        // An append that moves on to another turn counts only that turn's steps.
        await store.append(tenantId, id, [step(first!, 1), step(second!, 0.2)]);
        expect(await turnCost()).toEqual({ cause: second, costUsd: 0.2 });

        const restored = await store.getSnapshot(tenantId, id);
        expect(restored?.conversation.turnCost).toEqual({ cause: second, costUsd: 0.2 });
        expect(restored?.conversation.metrics.cost_usd).toBeCloseTo(2.15, 10);
      });

      it('refuses appends to a conversation that does not exist', async () => {
        const tenantId = uniqueName('tenant');
        await expect(store.append(tenantId, randomUUID(), [message('x')])).rejects.toBeInstanceOf(
          NotFoundError,
        );
        await expect(store.append(tenantId, 'nope', [message('x')])).rejects.toBeInstanceOf(
          NotFoundError,
        );
      });

      it('refuses text Postgres cannot store as a bad request', async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        await expect(
          store.append(tenantId, id, [message('nul \u0000 char')]),
        ).rejects.toBeInstanceOf(BadRequestError);
        // JSON cannot hold half of a surrogate pair either, in a body or in state.
        await expect(
          store.append(tenantId, id, [message('lone \ud800 surrogate')]),
        ).rejects.toBeInstanceOf(BadRequestError);
        await expect(
          store.append(tenantId, id, [message('fine', { stateDelta: { k: 'nul \u0000' } })]),
        ).rejects.toBeInstanceOf(BadRequestError);
        expect(await fixture.countEvents(conversation.id)).toBe(0);
        // A backslash and the letters of an escape are plain text.
        await store.append(tenantId, id, [message('\\u0000 and \\ud800')]);
        expect(await fixture.countEvents(conversation.id)).toBe(1);
      });
    });

    describe('incarnations', () => {
      it('refuses a write for another incarnation of the id and reads it nothing', async () => {
        const conversation = await created();
        const { tenantId, id, incarnation } = conversation;
        const [written] = await store.append(tenantId, id, [message('mine')], { incarnation });
        expect(written).toMatchObject({ duplicate: false, event: { id: 0 } });
        const other = '00000000-0000-4000-8000-000000000000';
        await expect(
          store.append(tenantId, id, [message('stale')], { incarnation: other }),
        ).rejects.toBeInstanceOf(NotFoundError);
        expect(await fixture.countEvents(id)).toBe(1);
        expect(
          await store.readEventPage(tenantId, id, {
            limit: 10,
            maxBytes: 10_000,
            incarnation: other,
          }),
        ).toEqual({ events: [], hasMore: false });
        expect(
          (await store.readEventPage(tenantId, id, { limit: 10, maxBytes: 10_000, incarnation }))
            .events,
        ).toHaveLength(1);
      });
    });

    describe('readEventPage', () => {
      it('cuts a page at its limit or its bytes, never before the first event, and says when more follow', async () => {
        const { tenantId, id } = await created();
        // Five events of the same size.
        await store.append(
          tenantId,
          id,
          Array.from({ length: 5 }, (_, i) => message(`m${i}`)),
        );
        const page = (range: Partial<Parameters<ConversationStore['readEventPage']>[2]>) =>
          store
            .readEventPage(tenantId, id, { limit: 100, maxBytes: 1_000_000, ...range })
            .then(({ events, hasMore }) => ({ ids: events.map((e) => e.id), hasMore }));
        const size = Buffer.byteLength(JSON.stringify(message('m0').body));
        expect(await page({})).toEqual({ ids: [0, 1, 2, 3, 4], hasMore: false });
        expect(await page({ limit: 2 })).toEqual({ ids: [0, 1], hasMore: true });
        expect(await page({ maxBytes: 2 * size })).toEqual({ ids: [0, 1], hasMore: true });
        expect(await page({ maxBytes: 2 * size + 1 })).toEqual({ ids: [0, 1], hasMore: true });
        expect(await page({ maxBytes: 1 })).toEqual({ ids: [0], hasMore: true });
        expect(await page({ fromId: 3 })).toEqual({ ids: [3, 4], hasMore: false });
        expect(await page({ fromId: 1, toId: 3, limit: 3 })).toEqual({
          ids: [1, 2, 3],
          hasMore: false,
        });
        expect(await page({ reverse: true, limit: 2 })).toEqual({ ids: [4, 3], hasMore: true });
        expect(await page({ reverse: true, toId: 1 })).toEqual({ ids: [1, 0], hasMore: false });
        // Another tenant reads nothing.
        expect(
          await store.readEventPage(uniqueName('tenant'), id, { limit: 10, maxBytes: 10_000 }),
        ).toEqual({ events: [], hasMore: false });
      });
    });

    describe('lastEventIds', () => {
      it('reads the last event ids of many conversations at once, each only with its tenant', async () => {
        const a = await created();
        const b = await created();
        await store.append(a.tenantId, a.id, [message('one'), message('two')]);
        const found = await store.lastEventIds([
          { tenantId: a.tenantId, conversationId: a.id },
          { tenantId: b.tenantId, conversationId: b.id },
          { tenantId: 'another-tenant', conversationId: a.id },
          { tenantId: a.tenantId, conversationId: 'not-a-uuid' },
        ]);
        expect(found).toEqual(
          new Map([
            [a.id, 1],
            [b.id, -1],
          ]),
        );
        expect(
          await store.lastEventIds([{ tenantId: 'another-tenant', conversationId: a.id }]),
        ).toEqual(new Map());
      });
    });

    describe('readEvents', () => {
      it('refuses a limit that is not a positive integer', async () => {
        const { tenantId, id } = await created();
        for (const limit of [0, -1, 1.5, Number.NaN]) {
          await expect(store.readEvents(tenantId, id, { limit })).rejects.toMatchObject({
            code: 'BAD_REQUEST',
            field: 'limit',
          });
          await expect(
            store.readEventPage(tenantId, id, { limit, maxBytes: 1000 }),
          ).rejects.toMatchObject({ code: 'BAD_REQUEST', field: 'limit' });
          await expect(store.listConversations(tenantId, { limit })).rejects.toMatchObject({
            code: 'BAD_REQUEST',
            field: 'limit',
          });
        }
      });

      it('reads inclusive ranges in both directions', async () => {
        const conversation = await created();
        const { tenantId, id } = conversation;
        await store.append(
          tenantId,
          id,
          Array.from({ length: 10 }, (_, i) => message(`m${i}`)),
        );
        const ids = async (range: Parameters<ConversationStore['readEvents']>[2]) =>
          (await store.readEvents(tenantId, id, range)).map((event) => event.id);

        expect(await ids({ limit: 100 })).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        expect(await ids({ fromId: 2, toId: 5, limit: 100 })).toEqual([2, 3, 4, 5]);
        expect(await ids({ fromId: 2, toId: 5, limit: 2 })).toEqual([2, 3]);
        expect(await ids({ fromId: 7, limit: 100 })).toEqual([7, 8, 9]);
        expect(await ids({ reverse: true, limit: 2 })).toEqual([9, 8]);
        expect(await ids({ reverse: true, toId: 7, limit: 3 })).toEqual([7, 6, 5]);
        expect(await ids({ reverse: true, fromId: 3, toId: 5, limit: 100 })).toEqual([5, 4, 3]);
        expect(await ids({ fromId: 10, limit: 100 })).toEqual([]);
        expect(await ids({ fromId: 6, toId: 4, limit: 100 })).toEqual([]);
        expect(await ids({ fromId: 4, toId: 4, limit: 100 })).toEqual([4]);
      });
    });

    describe('listConversations', () => {
      it('pages newest activity first, stable while new conversations arrive', async () => {
        const tenantId = uniqueName('tenant');
        const existing = [];
        for (let i = 0; i < 13; i += 1) existing.push(await created({ tenantId }));
        // Activity reorders them: the appended-to ones come first.
        // PGlite's clock has millisecond resolution: two appends within one
        // millisecond tie and are then ordered by id, so the bumps are set apart.
        await store.append(tenantId, existing[3]!.id, [message('bump')]);
        await new Promise((resolve) => setTimeout(resolve, 3));
        await store.append(tenantId, existing[7]!.id, [message('bump')]);
        await created({ tenantId, userId: 'bob' });

        // The whole list at once: newest activity first, ties by id.
        const all = await store.listConversations(tenantId, { userId: 'alice', limit: 100 });
        expect(all.nextCursor).toBeNull();
        const expected = all.items.map((item) => item.id);
        expect(expected).toHaveLength(existing.length);
        const times = all.items.map((item) => item.updatedAt.getTime());
        expect(times).toEqual([...times].sort((x, y) => y - x));
        expect(expected.slice(0, 2)).toEqual([existing[7]!.id, existing[3]!.id]);

        const seen: string[] = [];
        let cursor: string | undefined;
        let pages = 0;
        do {
          const page = await store.listConversations(tenantId, {
            userId: 'alice',
            limit: 4,
            ...(cursor === undefined ? {} : { cursor }),
          });
          seen.push(...page.items.map((item) => item.id));
          expect(page.items.every((item) => item.userId === 'alice')).toBe(true);
          cursor = page.nextCursor ?? undefined;
          // Every store writes the one page_id format, the last item's position.
          if (cursor !== undefined) expect(decodeCursor(cursor).id).toBe(page.items.at(-1)!.id);
          pages += 1;
          // Newer conversations land before the cursor: never in later pages.
          await created({ tenantId });
        } while (cursor !== undefined);
        expect(seen).toEqual(expected);
        expect(pages).toBe(4);
      });

      it('lists every user of the tenant without userId', async () => {
        const tenantId = uniqueName('tenant');
        await created({ tenantId });
        await created({ tenantId, userId: 'bob' });
        const page = await store.listConversations(tenantId, { limit: 10 });
        expect(page.items.map((item) => item.userId).sort()).toEqual(['alice', 'bob']);
        expect(page.nextCursor).toBeNull();
      });

      it('refuses an invalid page_id', async () => {
        const tenantId = uniqueName('tenant');
        for (const cursor of [
          'garbage',
          '',
          'WzEsMl0',
          Buffer.from('["1","x"]').toString('base64url'),
        ]) {
          await expect(
            store.listConversations(tenantId, { limit: 5, cursor }),
          ).rejects.toMatchObject({
            code: 'BAD_REQUEST',
            field: 'page_id',
            message: 'invalid page_id',
          });
        }
      });
    });

    describe('updates', () => {
      it('updates title and replaces metadata, marking the conversation active', async () => {
        const conversation = await created();
        const updated = await store.updateConversation(conversation.tenantId, conversation.id, {
          title: 'renamed',
          metadata: { only: 'this' },
        });
        expect(updated).toMatchObject({ title: 'renamed', metadata: { only: 'this' } });
        expect(updated!.updatedAt.getTime()).toBeGreaterThanOrEqual(
          conversation.updatedAt.getTime(),
        );
        const metadataOnly = await store.updateConversation(
          conversation.tenantId,
          conversation.id,
          {
            metadata: {},
          },
        );
        expect(metadataOnly).toMatchObject({ title: 'renamed', metadata: {} });
      });

      it('adds usage to the metrics with an update, beside what the events added', async () => {
        const conversation = await created();
        await store.append(conversation.tenantId, conversation.id, [
          {
            ...message('a'),
            metricsDelta: {
              iterations: 1,
              prompt_tokens: 10,
              completion_tokens: 5,
              cost_usd: 0.25,
            },
          },
        ]);
        const updated = await store.updateConversation(conversation.tenantId, conversation.id, {
          title: 'titled',
          addMetrics: { prompt_tokens: 30, completion_tokens: 2, cost_usd: 0.5 },
        });
        const expected = { iterations: 1, prompt_tokens: 40, completion_tokens: 7, cost_usd: 0.75 };
        expect(updated?.metrics).toEqual(expected);
        // An update without usage leaves the metrics alone.
        await store.updateConversation(conversation.tenantId, conversation.id, { title: 'again' });
        const read = await store.getConversation(conversation.tenantId, conversation.id);
        expect(read?.metrics).toEqual(expected);
      });

      it('deletes a conversation with its events', async () => {
        const conversation = await created();
        await store.append(conversation.tenantId, conversation.id, [message('a'), message('b')]);
        expect(await fixture.countEvents(conversation.id)).toBe(2);
        expect(await store.deleteConversation(conversation.tenantId, conversation.id)).toBe(true);
        expect(await fixture.countEvents(conversation.id)).toBe(0);
        expect(await store.getConversation(conversation.tenantId, conversation.id)).toBeNull();
        expect(await store.deleteConversation(conversation.tenantId, conversation.id)).toBe(false);
        await expect(
          store.append(conversation.tenantId, conversation.id, [message('c')]),
        ).rejects.toBeInstanceOf(NotFoundError);
      });

      it('sets statuses and resets the running ones', async () => {
        const running = await created();
        const starting = await created();
        const failed = await created();
        expect(await store.setStatus(running.tenantId, running.id, 'RUNNING')).toBe(true);
        expect(await store.setStatus(starting.tenantId, starting.id, 'STARTING')).toBe(true);
        expect(await store.setStatus(failed.tenantId, failed.id, 'ERROR')).toBe(true);
        expect((await store.getConversation(running.tenantId, running.id))?.status).toBe('RUNNING');
        const reset = (await store.resetRunningStatuses()).map((ref) => ref.conversationId);
        expect(reset).toEqual(expect.arrayContaining([running.id, starting.id]));
        expect(reset).not.toContain(failed.id);
        expect((await store.getConversation(running.tenantId, running.id))?.status).toBe('STOPPED');
        expect((await store.getConversation(starting.tenantId, starting.id))?.status).toBe(
          'STOPPED',
        );
        expect((await store.getConversation(failed.tenantId, failed.id))?.status).toBe('ERROR');
      });

      it('refuses a status it does not know', async () => {
        const { tenantId, id } = await created();
        const unknown = 'DANCING' as ConversationStatus;
        await expect(store.setStatus(tenantId, id, unknown)).rejects.toMatchObject({
          code: 'BAD_REQUEST',
          field: 'status',
        });
        await expect(store.setStatus(tenantId, id, 'RUNNING', [unknown])).rejects.toMatchObject({
          code: 'BAD_REQUEST',
          field: 'status',
        });
        expect((await store.getConversation(tenantId, id))?.status).toBe('STOPPED');
      });

      it('changes nothing for an empty patch, not even the activity time', async () => {
        const conversation = await created();
        await new Promise((resolve) => setTimeout(resolve, 3));
        const same = await store.updateConversation(conversation.tenantId, conversation.id, {});
        expect(same).toEqual(conversation);
        expect(await store.getConversation(conversation.tenantId, conversation.id)).toEqual(
          conversation,
        );
      });

      it("refuses text Postgres cannot store in a conversation's title or metadata", async () => {
        for (const overrides of [{ title: 'nul \u0000' }, { metadata: { k: 'nul \u0000' } }]) {
          const input = newConversation(overrides);
          await expect(store.createConversation(input)).rejects.toBeInstanceOf(BadRequestError);
          expect(await store.getConversation(input.tenantId, input.id)).toBeNull();
        }
        const conversation = await created();
        const { tenantId, id } = conversation;
        for (const patch of [
          { title: 'nul \u0000' },
          { metadata: { k: 'nul \u0000' } },
          { metadata: { k: 'lone \ud800' } },
        ]) {
          await expect(store.updateConversation(tenantId, id, patch)).rejects.toBeInstanceOf(
            BadRequestError,
          );
        }
        expect(await store.getConversation(tenantId, id)).toEqual(conversation);
      });

      it('sets a status only from an expected one', async () => {
        const { tenantId, id } = await created();
        expect(await store.setStatus(tenantId, id, 'RUNNING', ['STARTING'])).toBe(false);
        expect((await store.getConversation(tenantId, id))?.status).toBe('STOPPED');
        expect(await store.setStatus(tenantId, id, 'STARTING', ['STOPPED', 'ERROR'])).toBe(true);
        expect(await store.setStatus(tenantId, id, 'RUNNING', ['STARTING'])).toBe(true);
        expect((await store.getConversation(tenantId, id))?.status).toBe('RUNNING');
        expect(await store.setStatus(tenantId, randomUUID(), 'RUNNING')).toBe(false);
      });

      it('releases a lease only for its holder at its epoch', async () => {
        const { tenantId, id } = await created();
        const epoch = await store.acquireLease(tenantId, id, 'w1');
        await store.releaseLease(tenantId, id, 'w2', epoch);
        await store.releaseLease(tenantId, id, 'w1', epoch - 1);
        expect((await store.getConversation(tenantId, id))?.leaseOwner).toBe('w1');
        await store.releaseLease(tenantId, id, 'w1', epoch);
        expect(await store.getConversation(tenantId, id)).toMatchObject({
          leaseOwner: null,
          leaseEpoch: epoch,
        });
      });

      it('finds an event by its client_event_id', async () => {
        const { tenantId, id } = await created();
        const [appended] = await store
          .append(tenantId, id, [message('a'), message('b', { clientEventId: 'key-b' })])
          .then((events) => events.slice(1));
        expect(await store.findEventByClientEventId(tenantId, id, 'key-b')).toEqual(
          appended!.event,
        );
        expect(await store.findEventByClientEventId(tenantId, id, 'key-c')).toBeNull();
      });

      it('bumps the lease epoch and records the owner', async () => {
        const conversation = await created();
        expect(await store.acquireLease(conversation.tenantId, conversation.id, 'w1')).toBe(1);
        expect(await store.acquireLease(conversation.tenantId, conversation.id, 'w2')).toBe(2);
        expect(await store.getConversation(conversation.tenantId, conversation.id)).toMatchObject({
          leaseEpoch: 2,
          leaseOwner: 'w2',
        });
      });
    });

    describe('model usage', () => {
      const usage = (model: string, costUsd: number) => ({
        model,
        promptTokens: 100,
        completionTokens: 20,
        costUsd,
        requests: 1,
      });

      it('records the usage a step carries with its events, by user, model, conversation and day', async () => {
        const tenantId = uniqueName('usage');
        const alice = await created({ tenantId, userId: 'alice' });
        const alicesOther = await created({ tenantId, userId: 'alice' });
        const bob = await created({ tenantId, userId: 'bob' });
        const elsewhere = await created({ userId: 'alice' });
        await store.append(tenantId, alice.id, [step(0, 0.5, { usage: usage('m1', 0.5) })]);
        await store.append(tenantId, alice.id, [
          step(0, 0.25, { usage: usage('m1', 0.25) }),
          step(0, 0.125, { usage: usage('m2', 0.125) }),
        ]);
        await store.append(tenantId, alicesOther.id, [step(0, 1, { usage: usage('m1', 1) })]);
        await store.append(tenantId, bob.id, [step(0, 2, { usage: usage('m2', 2) })]);
        await store.append(elsewhere.tenantId, elsewhere.id, [
          step(0, 4, { usage: usage('m1', 4) }),
        ]);
        const today = new Date().toISOString().slice(0, 10);
        const days = { from: today, to: today };

        const byModel = await store.usageReport(tenantId, { ...days, groupBy: 'model' });
        expect(byModel.results).toEqual([
          { key: 'm1', prompt_tokens: 300, completion_tokens: 60, cost_usd: 1.75, requests: 3 },
          { key: 'm2', prompt_tokens: 200, completion_tokens: 40, cost_usd: 2.125, requests: 2 },
        ]);
        expect(byModel.total).toEqual({
          prompt_tokens: 500,
          completion_tokens: 100,
          cost_usd: 3.875,
          requests: 5,
        });
        const byUser = await store.usageReport(tenantId, { ...days, groupBy: 'user' });
        expect(byUser.results.map((row) => [row.key, row.cost_usd])).toEqual([
          ['alice', 1.875],
          ['bob', 2],
        ]);
        const alices = await store.usageReport(tenantId, {
          ...days,
          groupBy: 'conversation',
          userId: 'alice',
        });
        expect(alices.results.map((row) => [row.key, row.requests]).sort()).toEqual(
          [
            [alice.id, 3],
            [alicesOther.id, 1],
          ].sort(),
        );
        const byDay = await store.usageReport(tenantId, { ...days, groupBy: 'day' });
        expect(byDay.results.map((row) => row.key)).toEqual([today]);
        expect(await store.usageCost(tenantId, { ...days, userId: 'alice' })).toBeCloseTo(1.875);
        expect(await store.usageCost(tenantId, days)).toBeCloseTo(3.875);
        expect(
          await store.usageReport(tenantId, {
            from: '2000-01-01',
            to: '2000-01-31',
            groupBy: 'day',
          }),
        ).toEqual({
          results: [],
          total: { prompt_tokens: 0, completion_tokens: 0, cost_usd: 0, requests: 0 },
        });
      });

      it("records a title request's usage with the metrics it adds", async () => {
        const conversation = await created({ userId: 'carol' });
        const today = new Date().toISOString().slice(0, 10);
        const updated = await store.updateConversation(conversation.tenantId, conversation.id, {
          title: 'named',
          addMetrics: { prompt_tokens: 100, completion_tokens: 20, cost_usd: 0.25 },
          addUsage: usage('m3', 0.25),
        });
        expect(updated?.metrics.cost_usd).toBeCloseTo(0.25);
        const report = await store.usageReport(conversation.tenantId, {
          from: today,
          to: today,
          groupBy: 'user',
        });
        expect(report.results).toEqual([
          { key: 'carol', prompt_tokens: 100, completion_tokens: 20, cost_usd: 0.25, requests: 1 },
        ]);
      });

      it('records nothing of an append that fails (the same transaction)', async () => {
        const conversation = await created();
        const today = new Date().toISOString().slice(0, 10);
        await expect(
          store.append(
            conversation.tenantId,
            conversation.id,
            [step(0, 1, { usage: usage('m1', 1) })],
            { leaseEpoch: 7 },
          ),
        ).rejects.toBeInstanceOf(LeaseLostError);
        expect(await store.usageCost(conversation.tenantId, { from: today, to: today })).toBe(0);
      });
    });

    describe('tenant isolation', () => {
      it('hides a conversation from another tenant on every read and write', async () => {
        const conversation = await created();
        await store.acquireLease(conversation.tenantId, conversation.id, 'owner');
        await store.append(conversation.tenantId, conversation.id, [
          message('secret', {
            clientEventId: 'key',
            stateDelta: { k: 'v', 'user:k': 'v', 'app:k': 'v' },
          }),
        ]);
        const before = await store.getSnapshot(conversation.tenantId, conversation.id);
        const intruder = uniqueName('tenant');
        const { id } = conversation;

        expect(await store.getConversation(intruder, id)).toBeNull();
        expect(await store.getSnapshot(intruder, id)).toBeNull();
        expect(await store.readEvents(intruder, id, { limit: 10 })).toEqual([]);
        expect((await store.listConversations(intruder, { limit: 10 })).items).toEqual([]);
        expect(
          (await store.listConversations(intruder, { userId: 'alice', limit: 10 })).items,
        ).toEqual([]);
        expect(await store.updateConversation(intruder, id, { title: 'pwned' })).toBeNull();
        expect(await store.setStatus(intruder, id, 'RUNNING')).toBe(false);
        expect(await store.findEventByClientEventId(intruder, id, 'key')).toBeNull();
        await expect(store.acquireLease(intruder, id, 'evil')).rejects.toBeInstanceOf(
          NotFoundError,
        );
        await store.releaseLease(intruder, id, 'owner', 1);
        await expect(
          store.append(intruder, id, [message('x', { stateDelta: { 'user:k': 'evil' } })]),
        ).rejects.toBeInstanceOf(NotFoundError);
        await expect(
          store.append(intruder, id, [message('x')], { leaseEpoch: 0 }),
        ).rejects.toBeInstanceOf(NotFoundError);
        expect(await store.deleteConversation(intruder, id)).toBe(false);

        expect(await store.getSnapshot(conversation.tenantId, id)).toEqual(before);
        expect(await fixture.countEvents(id)).toBe(1);
        // The intruder's tenant has no state of its own either.
        expect(await store.getScopedState(intruder, 'chat', 'alice')).toEqual({});
      });
    });
  });
}
