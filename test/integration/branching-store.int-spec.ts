// Fork and rewind in the store (docs/protocol.md "Branching"): the same cases on
// real Postgres, PGlite and the in-memory store that unit tests use.
import { randomUUID } from 'node:crypto';
import type { ConversationStore, EventDraft, NewConversation } from '@cs/core';
import { BadRequestError, ConflictError, NotFoundError } from '@cs/core';
import { InMemoryConversationStore } from '../fakes/in-memory-conversation-store.js';
import type { StoredEvent } from '@cs/protocol';
import type { SqlDatabase } from '@cs/store';
import { PostgresConversationStore, migrate, openPostgres } from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMigratedPglite } from '../support/migrated-template.js';
import { createScratchDatabase, uniqueName } from '../support/services.js';

interface Backend {
  name: string;
  open(): Promise<{
    store: ConversationStore;
    database: SqlDatabase | null;
    teardown(): Promise<void>;
  }>;
}

const backends: Backend[] = [
  {
    name: 'Postgres',
    async open() {
      const scratch = await createScratchDatabase('cs_branching', { migrated: true });
      const database = openPostgres(scratch.url, { poolSize: 8 });
      await migrate(database);
      return {
        store: new PostgresConversationStore(database),
        database,
        async teardown() {
          await database.close();
          await scratch.drop();
        },
      };
    },
  },
  {
    name: 'PGlite',
    async open() {
      const database = await openMigratedPglite();
      await migrate(database);
      return {
        store: new PostgresConversationStore(database),
        database,
        teardown: () => database.close(),
      };
    },
  },
  {
    name: 'the in-memory store',
    open() {
      return Promise.resolve({
        store: new InMemoryConversationStore(),
        database: null,
        teardown: () => Promise.resolve(),
      });
    },
  },
];

function newConversation(overrides: Partial<NewConversation> = {}): NewConversation {
  return {
    id: randomUUID(),
    tenantId: uniqueName('tenant'),
    userId: 'alice',
    appName: 'chat',
    title: 'a conversation',
    metadata: { topic: 'tests' },
    agent: { name: 'echo', config: { temperature: 0 } },
    instructions: 'be brief',
    settings: {
      confirmationMode: true,
      multitaskStrategy: 'interrupt',
      maxIterations: 7,
      maxBudgetUsd: null,
    },
    ...overrides,
  };
}

function message(content: string, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'user',
    body: { action: 'message', args: { content, image_urls: [], file_urls: [] }, message: content },
    ...extra,
  };
}

function answer(content: string, cause: number, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'agent',
    body: { action: 'message', args: { content }, message: content },
    cause,
    answers: cause,
    ...extra,
  };
}

function toolCall(cause: number, id: string): EventDraft {
  return {
    source: 'agent',
    body: {
      action: 'tool_call',
      args: { tool: 'set_state', arguments: { key: 'k', value: 1 }, tool_call_id: id },
      message: '',
    },
    cause,
    metricsDelta: { iterations: 1, prompt_tokens: 10, completion_tokens: 5, cost_usd: 0.5 },
  };
}

function toolResult(call: number, id: string): EventDraft {
  return {
    source: 'environment',
    body: {
      observation: 'tool_result',
      content: 'ok',
      extras: { tool: 'set_state', tool_call_id: id, is_error: false },
      message: 'ok',
    },
    cause: call,
  };
}

function stateChange(agentState: string, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'environment',
    body: {
      observation: 'agent_state_changed',
      content: '',
      extras: { agent_state: agentState },
      message: '',
    },
    ...extra,
  };
}

async function allEvents(store: ConversationStore, tenantId: string, id: string) {
  return store.readEvents(tenantId, id, { limit: 1000 });
}

describe.each(backends)('fork and rewind on $name', (backend) => {
  let store: ConversationStore;
  let teardown: () => Promise<void>;

  beforeAll(async () => {
    ({ store, teardown } = await backend.open());
  });

  afterAll(async () => {
    await teardown?.();
  });

  /** A conversation of 0: message, 1: answer (sets color red), 2: message, 3: tool call, 4: result (sets color blue, size 2), 5: answer. */
  async function conversationWithState() {
    const input = newConversation();
    await store.createConversation(input);
    const { tenantId, id } = input;
    await store.append(tenantId, id, [message('first')]);
    await store.append(tenantId, id, [
      answer('one', 0, { stateDelta: { color: 'red', 'user:seen': true } }),
    ]);
    await store.append(tenantId, id, [message('second')]);
    await store.append(tenantId, id, [toolCall(2, 'call_a')]);
    await store.append(tenantId, id, [
      { ...toolResult(3, 'call_a'), stateDelta: { color: 'blue', size: 2 } },
    ]);
    await store.append(tenantId, id, [answer('two', 2)]);
    return input;
  }

  describe('fork', () => {
    it('copies events 0..at_event_id with their ids, payloads and timestamps, and the state as it was then', async () => {
      const source = await conversationWithState();
      const before = await allEvents(store, source.tenantId, source.id);
      const forkId = randomUUID();
      const { conversation, created } = await store.fork(source.tenantId, source.id, {
        conversationId: forkId,
        userId: 'alice',
        atEventId: 2,
      });
      expect(created).toBe(true);
      expect(conversation).toMatchObject({
        id: forkId,
        userId: 'alice',
        title: 'a conversation',
        metadata: { topic: 'tests' },
        agent: { name: 'echo', config: { temperature: 0 } },
        instructions: 'be brief',
        settings: { confirmationMode: true, multitaskStrategy: 'interrupt', maxIterations: 7 },
        status: 'STOPPED',
        lastEventId: 2,
        answeredThrough: 2,
        metrics: { iterations: 0, prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 },
        forkedFrom: { conversationId: source.id, eventId: 2 },
      });
      expect(await allEvents(store, source.tenantId, forkId)).toEqual(before.slice(0, 3));
      const forkState = await store.getSnapshot(source.tenantId, forkId);
      const sourceState = await store.getSnapshot(source.tenantId, source.id);
      // The fork's state is the source's after event 2, not its latest.
      expect(forkState!.state).toEqual({ color: 'red', 'user:seen': true });
      expect(sourceState!.state).toEqual({ color: 'blue', size: 2, 'user:seen': true });
      // The source is untouched.
      expect(await allEvents(store, source.tenantId, source.id)).toEqual(before);
    });

    it('gives a copied tool call without its result a tool_result marked forked, and keeps title and metadata given', async () => {
      const source = await conversationWithState();
      const forkId = randomUUID();
      const { conversation } = await store.fork(source.tenantId, source.id, {
        conversationId: forkId,
        userId: 'alice',
        atEventId: 3,
        title: 'the fork',
        metadata: { branch: 1 },
      });
      expect(conversation).toMatchObject({
        title: 'the fork',
        metadata: { branch: 1 },
        lastEventId: 4,
      });
      const events = await allEvents(store, source.tenantId, forkId);
      expect(events.map((e) => e.id)).toEqual([0, 1, 2, 3, 4]);
      expect(events[4]).toMatchObject({
        source: 'environment',
        observation: 'tool_result',
        cause: 3,
        extras: { tool: 'set_state', tool_call_id: 'call_a', is_error: true, forked: true },
      });
    });

    it('forks the whole conversation by default, and a repeat with the same id returns the first fork', async () => {
      const source = await conversationWithState();
      const forkId = randomUUID();
      const first = await store.fork(source.tenantId, source.id, {
        conversationId: forkId,
        userId: 'bob',
      });
      expect(first.conversation).toMatchObject({ userId: 'bob', lastEventId: 5 });
      const again = await store.fork(source.tenantId, source.id, {
        conversationId: forkId,
        userId: 'bob',
      });
      expect(again.created).toBe(false);
      expect(again.conversation.id).toBe(forkId);
      // Taken by another conversation: a conflict.
      const other = await conversationWithState();
      await expect(
        store.fork(source.tenantId, source.id, { conversationId: other.id, userId: 'alice' }),
      ).rejects.toBeInstanceOf(ConflictError);
    });

    it('refuses a point that is not an event of the source, and a source of another tenant', async () => {
      const source = await conversationWithState();
      for (const atEventId of [6, -1, 1.5]) {
        const error = await store
          .fork(source.tenantId, source.id, {
            conversationId: randomUUID(),
            userId: 'alice',
            atEventId,
          })
          .catch((e: unknown) => e);
        expect(error).toBeInstanceOf(BadRequestError);
        expect((error as BadRequestError).field).toBe('at_event_id');
      }
      await expect(
        store.fork('another-tenant', source.id, { conversationId: randomUUID(), userId: 'alice' }),
      ).rejects.toBeInstanceOf(NotFoundError);
    });

    it('starts a fork made mid-approval stopped, its pending calls answered', async () => {
      const input = newConversation();
      await store.createConversation(input);
      await store.append(input.tenantId, input.id, [message('pay')]);
      await store.append(input.tenantId, input.id, [
        toolCall(0, 'call_pay'),
        stateChange('awaiting_user_confirmation'),
      ]);
      const forkId = randomUUID();
      const { conversation } = await store.fork(input.tenantId, input.id, {
        conversationId: forkId,
        userId: 'alice',
      });
      expect(conversation.agentState).toBe('stopped');
      const events = await allEvents(store, input.tenantId, forkId);
      expect(events.at(-1)).toMatchObject({ cause: 1, extras: { is_error: true, forked: true } });
      expect((await store.getConversation(input.tenantId, input.id))!.agentState).toBe(
        'awaiting_user_confirmation',
      );
    });
  });

  describe('rewind', () => {
    it('appends the rewind event, marks the events in between undone and restores the state', async () => {
      const source = await conversationWithState();
      const rewind = await store.rewind(source.tenantId, source.id, { toEventId: 1 });
      expect(rewind.duplicate).toBe(false);
      expect(rewind.event).toMatchObject({
        id: 6,
        source: 'user',
        action: 'rewind',
        args: { to_event_id: 1 },
      });
      const events = await allEvents(store, source.tenantId, source.id);
      expect(events.map((e) => e.undone_by)).toEqual([undefined, undefined, 6, 6, 6, 6, undefined]);
      // Undone events keep their payloads.
      expect(events[2]).toMatchObject({ action: 'message', args: { content: 'second' } });
      const snapshot = await store.getSnapshot(source.tenantId, source.id);
      expect(snapshot!.state).toEqual({ color: 'red', 'user:seen': true });
      expect(snapshot!.conversation.answeredThrough).toBe(6);
      // The REST page carries the marks too.
      const page = await store.readEventPage(source.tenantId, source.id, {
        limit: 100,
        maxBytes: 1 << 20,
      });
      expect(page.events.map((e: StoredEvent) => e.undone_by ?? null)).toEqual([
        null,
        null,
        6,
        6,
        6,
        6,
        null,
      ]);
    });

    it('answers a repeated idempotency key with the first rewind, and refuses it for another point', async () => {
      const source = await conversationWithState();
      const first = await store.rewind(source.tenantId, source.id, {
        toEventId: 2,
        clientEventId: 'k1',
      });
      const again = await store.rewind(source.tenantId, source.id, {
        toEventId: 2,
        clientEventId: 'k1',
      });
      expect(again).toEqual({ event: first.event, duplicate: true });
      await expect(
        store.rewind(source.tenantId, source.id, { toEventId: 1, clientEventId: 'k1' }),
      ).rejects.toBeInstanceOf(ConflictError);
      expect((await store.getConversation(source.tenantId, source.id))!.lastEventId).toBe(
        first.event.id,
      );
    });

    it('refuses a point after the last event, a negative one and an undone one', async () => {
      const source = await conversationWithState();
      await store.rewind(source.tenantId, source.id, { toEventId: 1 });
      for (const toEventId of [7, -2, 3]) {
        const error = await store
          .rewind(source.tenantId, source.id, { toEventId })
          .catch((e: unknown) => e);
        expect(error).toBeInstanceOf(BadRequestError);
        expect((error as BadRequestError).field).toBe('to_event_id');
      }
      await expect(
        store.rewind('another-tenant', source.id, { toEventId: 1 }),
      ).rejects.toBeInstanceOf(NotFoundError);
    });

    it('to a user message with answerAgain leaves that message to answer, its turn cost afresh', async () => {
      const source = await conversationWithState();
      await store.rewind(source.tenantId, source.id, { toEventId: 2, answerAgain: true });
      const record = await store.getConversation(source.tenantId, source.id);
      expect(record!.answeredThrough).toBe(1);
      expect(record!.turnCost).toBeNull();
    });

    it('answers a kept tool call whose result it undoes, and a fork after a rewind keeps the marks it copies', async () => {
      const source = await conversationWithState();
      const rewind = await store.rewind(source.tenantId, source.id, { toEventId: 3 });
      const events = await allEvents(store, source.tenantId, source.id);
      expect(events.slice(rewind.event.id)).toMatchObject([
        { action: 'rewind' },
        { observation: 'tool_result', cause: 3, extras: { is_error: true, rewound: true } },
      ]);
      expect(events[4]!.undone_by).toBe(rewind.event.id);
      // A fork before the rewind sees event 4 as it was; one after keeps the mark.
      const early = randomUUID();
      await store.fork(source.tenantId, source.id, {
        conversationId: early,
        userId: 'alice',
        atEventId: 5,
      });
      const earlyEvents = await allEvents(store, source.tenantId, early);
      expect(earlyEvents.every((e) => e.undone_by === undefined)).toBe(true);
      expect((await store.getSnapshot(source.tenantId, early))!.state).toMatchObject({
        color: 'blue',
        size: 2,
      });
      const late = randomUUID();
      await store.fork(source.tenantId, source.id, { conversationId: late, userId: 'alice' });
      const lateEvents = await allEvents(store, source.tenantId, late);
      expect(lateEvents[4]!.undone_by).toBe(rewind.event.id);
      expect((await store.getSnapshot(source.tenantId, late))!.state).toEqual({
        color: 'red',
        'user:seen': true,
      });
    });

    it('keeps the meaning of rewinds among the first events of a new conversation (a replayed history)', async () => {
      const input = newConversation();
      const rewind = (toEventId: number): EventDraft => ({
        source: 'user',
        body: { action: 'rewind', args: { to_event_id: toEventId }, message: '' },
      });
      await store.createConversation(input, [
        message('first'),
        answer('one', 0),
        message('second'),
        answer('two', 2),
        rewind(1),
        message('third'),
        answer('three', 5),
        rewind(0),
      ]);
      const events = await allEvents(store, input.tenantId, input.id);
      expect(events.map((event) => event.undone_by ?? null)).toEqual([
        null,
        7,
        4,
        4,
        7,
        7,
        7,
        null,
      ]);
      const refused = newConversation();
      await expect(
        store.createConversation(refused, [
          message('first'),
          answer('one', 0),
          message('x'),
          rewind(1),
          // 2 is undone by then.
          rewind(2),
        ]),
      ).rejects.toMatchObject({ field: 'to_event_id' });
      // All of it or none.
      expect(await store.getConversation(refused.tenantId, refused.id)).toBeNull();
    });

    it('rewinds twice: a later rewind to before the first undoes the first', async () => {
      const source = await conversationWithState();
      const first = await store.rewind(source.tenantId, source.id, { toEventId: 3 });
      await store.append(source.tenantId, source.id, [
        message('third', { stateDelta: { mood: 'ok' } }),
      ]);
      const second = await store.rewind(source.tenantId, source.id, { toEventId: 0 });
      const events = await allEvents(store, source.tenantId, source.id);
      expect(events[4]!.undone_by).toBe(first.event.id);
      expect(events[first.event.id]!.undone_by).toBe(second.event.id);
      expect(events[1]!.undone_by).toBe(second.event.id);
      expect((await store.getSnapshot(source.tenantId, source.id))!.state).toEqual({
        'user:seen': true,
      });
    });
  });
});
