// The event store against real Postgres (a scratch database) and PGlite (in
// memory): the same cases on both, since the apps run on either.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ConversationStore, EventDraft, NewConversation } from '@cs/core';
import {
  AgentBusyError,
  BadRequestError,
  ConflictError,
  LeaseLostError,
  NotFoundError,
} from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import { sqlErrorCode } from '@cs/store';
import {
  DataDirLockedError,
  PostgresConversationStore,
  WriteClock,
  loadMigrations,
  lockDataDir,
  migrate,
  openEmbeddedDatabase,
  openPglite,
  openPostgres,
  openStore,
} from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPgBouncer } from '../support/pgbouncer.js';
import { createScratchDatabase, uniqueName } from '../support/services.js';

interface Backend {
  name: string;
  open(): Promise<{
    database: SqlDatabase;
    /** Another pool on the same database (another process's view); PGlite has only one. */
    another(): SqlDatabase | null;
    teardown(): Promise<void>;
  }>;
}

const backends: Backend[] = [
  {
    name: 'Postgres',
    async open() {
      const scratch = await createScratchDatabase('cs_store');
      const database = openPostgres(scratch.url, { poolSize: 24 });
      return {
        database,
        another: () => openPostgres(scratch.url, { poolSize: 10 }),
        async teardown() {
          await database.close();
          await scratch.drop();
        },
      };
    },
  },
  {
    // Nothing prepared, no session state: every statement and transaction may
    // meet another server connection.
    name: 'Postgres through PgBouncer in transaction mode',
    async open() {
      const scratch = await createScratchDatabase('cs_store_bouncer');
      const bouncer = await startPgBouncer();
      const url = bouncer.urlFor(scratch.url);
      const database = openPostgres(url, { poolSize: 24, preparedStatements: false });
      return {
        database,
        another: () => openPostgres(url, { poolSize: 10, preparedStatements: false }),
        async teardown() {
          await database.close();
          await bouncer.stop();
          await scratch.drop();
        },
      };
    },
  },
  {
    name: 'PGlite',
    async open() {
      const database = await openPglite(undefined);
      return { database, another: () => null, teardown: () => database.close() };
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
    agent: { name: 'echo', config: {} },
    instructions: null,
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

function agentStateChanged(agentState: string, extra: Partial<EventDraft> = {}): EventDraft {
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
function step(cause: number, costUsd: number, extra: Partial<EventDraft> = {}): EventDraft {
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

async function countEvents(database: SqlDatabase, conversationId: string): Promise<number> {
  const { rows } = await database.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM events WHERE conversation_id = $1',
    [conversationId],
  );
  return rows[0]!.n;
}

/**
 * The database with a count of the statements run outside transactions and of
 * transactions, and the error codes of the statements that failed.
 */
function countingDatabase(database: SqlDatabase): {
  database: SqlDatabase;
  calls: { statements: number; transactions: number; errors: string[] };
} {
  const calls = { statements: 0, transactions: 0, errors: [] as string[] };
  const counted = Object.create(database) as SqlDatabase;
  counted.query = async (...args) => {
    calls.statements += 1;
    try {
      return await database.query(...args);
    } catch (error) {
      calls.errors.push(sqlErrorCode(error) ?? 'unknown');
      throw error;
    }
  };
  counted.transaction = (fn) => {
    calls.transactions += 1;
    return database.transaction(fn);
  };
  return { database: counted, calls };
}

describe.each(backends)('PostgresConversationStore on $name', (backend) => {
  let database: SqlDatabase;
  let store: ConversationStore;
  let teardown: () => Promise<void>;
  let another: () => SqlDatabase | null;

  beforeAll(async () => {
    ({ database, another, teardown } = await backend.open());
    await migrate(database);
    store = new PostgresConversationStore(database);
  });

  afterAll(async () => {
    await teardown?.();
  });

  async function created(overrides: Partial<NewConversation> = {}) {
    return (await store.createConversation(newConversation(overrides))).conversation;
  }

  describe('migrations', () => {
    it('applies nothing the second time', async () => {
      expect(await migrate(database)).toEqual([]);
      const { rows } = await database.query<{ name: string }>(
        'SELECT name FROM schema_migrations ORDER BY name',
      );
      expect(rows.map((row) => row.name)).toEqual((await loadMigrations()).map((m) => m.name));
    });
  });

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
      expect(conversation.createdAt).toBeInstanceOf(Date);
      expect(await store.getConversation(input.tenantId, input.id)).toEqual(conversation);
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
      const stored = await store.readEvents(conversation.tenantId, conversation.id, { limit: 100 });
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
      const stored = await store.readEvents(conversation.tenantId, conversation.id, { limit: 100 });
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
      const stored = await store.readEvents(conversation.tenantId, conversation.id, { limit: 10 });
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

      expect(await countEvents(database, conversation.id)).toBe(1);
      const snapshot = await store.getSnapshot(conversation.tenantId, conversation.id);
      expect(snapshot?.conversation.lastEventId).toBe(0);
      expect(snapshot?.state).toEqual({ counter: 1 });
    });

    it('writes a plain append in one statement, and takes a transaction only when it must', async () => {
      const conversation = await created();
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);
      const { tenantId, id } = conversation;

      await counting.append(tenantId, id, [message('plain', { clientEventId: 'k1' })]);
      await counting.append(tenantId, id, [agentStateChanged('running'), message('two')], {});
      expect(counted.calls).toEqual({ statements: 2, transactions: 0, errors: [] });

      // A stored key, a user: key and a stale epoch need the transaction's reads.
      await counting.append(tenantId, id, [message('plain', { clientEventId: 'k1' })]);
      await counting.append(tenantId, id, [message('x', { stateDelta: { 'user:tz': 'UTC' } })]);
      await expect(
        counting.append(tenantId, id, [message('late')], { leaseEpoch: 7 }),
      ).rejects.toBeInstanceOf(LeaseLostError);
      expect(counted.calls.transactions).toBe(3);
      const events = await store.readEvents(tenantId, id, { limit: 10 });
      expect(events.map((e) => e.id)).toEqual([0, 1, 2, 3]);
    });

    it('writes concurrent appends to many conversations in shared statements, each as if alone', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 40 }, () => created({ tenantId })),
      );
      const [stale, repeated] = conversations;
      await store.append(tenantId, repeated!.id, [message('first', { clientEventId: 'dup' })]);
      const epoch = await store.acquireLease(tenantId, stale!.id, 'worker-a');
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);

      const results = await Promise.allSettled(
        conversations.map((conversation, i) =>
          counting.append(
            tenantId,
            conversation.id,
            conversation === repeated
              ? [message('first', { clientEventId: 'dup' })]
              : [message(`m${i}`, { stateDelta: { n: i } }), agentStateChanged('running')],
            { leaseEpoch: conversation === stale ? epoch - 1 : undefined },
          ),
        ),
      );

      expect(results[0]).toMatchObject({ status: 'rejected', reason: expect.any(LeaseLostError) });
      expect(results[1]).toMatchObject({ status: 'fulfilled', value: [{ duplicate: true }] });
      for (const [i, result] of results.entries()) {
        if (i < 2) continue;
        const conversation = conversations[i]!;
        expect(result).toMatchObject({
          status: 'fulfilled',
          value: [{ event: { id: 0, message: `m${i}` } }, { event: { id: 1 } }],
        });
        const snapshot = await store.getSnapshot(tenantId, conversation.id);
        expect(snapshot).toMatchObject({
          conversation: { lastEventId: 1, agentState: 'running' },
          state: { n: i },
        });
      }
      expect(await countEvents(database, stale!.id)).toBe(0);
      expect(await countEvents(database, repeated!.id)).toBe(1);
      // Appends that queued behind the first few shared statements.
      expect(counted.calls.statements).toBeLessThan(conversations.length / 2);
    });

    it('writes each append in a statement of its own conversation with cross-conversation batches off', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 12 }, () => created({ tenantId })),
      );
      const counted = countingDatabase(database);
      const recorded: string[] = [];
      const query = counted.database.query.bind(counted.database);
      counted.database.query = (sql, params, options) => {
        recorded.push(sql);
        return query(sql, params, options);
      };
      const unbatched = new PostgresConversationStore(counted.database, {
        crossConversationBatches: false,
      });
      const results = await Promise.all(
        conversations.map((conversation, i) =>
          unbatched.append(tenantId, conversation.id, [
            message(`m${i}`, { stateDelta: { n: i } }),
            agentStateChanged('running'),
          ]),
        ),
      );
      for (const [i, result] of results.entries()) {
        expect(result.map((a) => [a.event.id, a.duplicate])).toEqual([
          [0, false],
          [1, false],
        ]);
        expect(await store.getSnapshot(tenantId, conversations[i]!.id)).toMatchObject({
          conversation: { lastEventId: 1, agentState: 'running' },
          state: { n: i },
        });
      }
      expect(counted.calls).toEqual({ statements: 12, transactions: 0, errors: [] });
      expect(recorded.some((sql) => sql.includes('jsonb_to_recordset($1::jsonb)'))).toBe(false);
    });

    it('never deadlocks when two processes append to the same conversations in opposite orders', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 20 }, () => created({ tenantId })),
      );
      const other = another();
      const databases = [countingDatabase(database), countingDatabase(other ?? database)];
      try {
        const stores = databases.map((each) => new PostgresConversationStore(each.database));
        for (let round = 0; round < 5; round += 1) {
          await Promise.all(
            stores.flatMap((each, s) =>
              (s === 0 ? conversations : [...conversations].reverse()).map((conversation) =>
                each.append(tenantId, conversation.id, [message(`round ${round}`)]),
              ),
            ),
          );
        }
        for (const conversation of conversations) {
          const events = await store.readEvents(tenantId, conversation.id, { limit: 20 });
          expect(events.map((e) => e.id)).toEqual([...Array(10).keys()]);
        }
        // A deadlock would be retried and go unnoticed but for its error (40P01).
        expect(databases.flatMap((each) => each.calls.errors)).toEqual([]);
      } finally {
        await other?.close();
      }
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
      expect(await countEvents(database, conversation.id)).toBe(2);
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
      expect(await countEvents(database, conversation.id)).toBe(1);
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

      const { rows } = await database.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM conversations, user_states, app_states
          WHERE conversations.tenant_id = $1
            AND (conversations.state::text LIKE '%scratch%'
                 OR user_states.state::text LIKE '%scratch%'
                 OR app_states.state::text LIKE '%scratch%')`,
        [tenantId],
      );
      expect(rows[0]!.n).toBe(0);
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
      const { own: _own, ...shared } = (await store.getSnapshot(tenantId, conversation.id))!.state;
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
      expect(await countEvents(database, id)).toBe(1);

      await store.append(tenantId, id, [message('user write, no lease')]);
      await store.append(tenantId, id, [agentStateChanged('awaiting_user_input')], {
        leaseEpoch: 2,
      });
      const { rows } = await database.query<{ id: number; lease_epoch: number | null }>(
        'SELECT id, lease_epoch FROM events WHERE conversation_id = $1 ORDER BY id',
        [id],
      );
      expect(rows).toEqual([
        { id: 0, lease_epoch: 1 },
        { id: 1, lease_epoch: null },
        { id: 2, lease_epoch: 2 },
      ]);
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

    it('counts the turn cost of appends that share a statement, each as if alone', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = await Promise.all(
        Array.from({ length: 20 }, () => created({ tenantId })),
      );
      for (const conversation of conversations) {
        await store.append(tenantId, conversation.id, [
          message('go'),
          message('next'),
          step(0, 0.5),
        ]);
      }
      const counted = countingDatabase(database);
      const counting = new PostgresConversationStore(counted.database);
      await Promise.all(
        conversations.map((conversation, i) =>
          counting.append(tenantId, conversation.id, [step(i % 2 === 0 ? 0 : 1, 0.25)]),
        ),
      );
      expect(counted.calls.statements).toBeLessThan(conversations.length / 2);
      for (const [i, conversation] of conversations.entries()) {
        expect((await store.getSnapshot(tenantId, conversation.id))?.conversation.turnCost).toEqual(
          i % 2 === 0 ? { cause: 0, costUsd: 0.75 } : { cause: 1, costUsd: 0.25 },
        );
      }
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
      await expect(
        store.append(conversation.tenantId, conversation.id, [message('nul \u0000 char')]),
      ).rejects.toBeInstanceOf(BadRequestError);
      expect(await countEvents(database, conversation.id)).toBe(0);
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
    it("takes a new conversation's times from the write clock its activity times come from", async () => {
      // Activity order compares creation times with later append times: one
      // clock for both (the database's now() had microseconds the store's
      // clock, in whole milliseconds, could fall behind within one).
      const clocked = new PostgresConversationStore(database, {
        clock: new WriteClock(() => Date.parse('2026-01-02T03:04:05.678Z')),
      });
      const { conversation } = await clocked.createConversation(newConversation());
      expect(conversation.createdAt.toISOString()).toBe('2026-01-02T03:04:05.678Z');
      const { rows } = await database.query<{ created: string; updated: string }>(
        `SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created,
                to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS updated
           FROM conversations WHERE id = $1`,
        [conversation.id],
      );
      const at = '2026-01-02T03:04:05.678000Z';
      expect(rows[0]).toEqual({ created: at, updated: at });
    });

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

      const expected = (
        await database.query<{ id: string }>(
          `SELECT id FROM conversations WHERE tenant_id = $1 AND user_id = 'alice'
            ORDER BY updated_at DESC, id DESC`,
          [tenantId],
        )
      ).rows.map((row) => row.id);
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
        pages += 1;
        // Newer conversations land before the cursor: never in later pages.
        await created({ tenantId });
      } while (cursor !== undefined);
      expect(seen).toEqual(expected);
      expect(pages).toBe(4);
    });

    it('keeps rows apart whose activity differs by microseconds', async () => {
      const tenantId = uniqueName('tenant');
      const conversations = [];
      for (let i = 0; i < 6; i += 1) conversations.push(await created({ tenantId }));
      // Six rows within one millisecond, two of them at the very same instant.
      const micros = ['100', '101', '102', '102', '103', '104'];
      for (const [i, conversation] of conversations.entries()) {
        await database.query(
          `UPDATE conversations SET updated_at = timestamptz '2030-01-01 00:00:00.123' + $2::int * interval '1 microsecond'
            WHERE id = $1`,
          [conversation.id, Number(micros[i]) - 100],
        );
      }
      const seen: string[] = [];
      let cursor: string | undefined;
      do {
        const page = await store.listConversations(tenantId, {
          limit: 1,
          ...(cursor === undefined ? {} : { cursor }),
        });
        seen.push(...page.items.map((item) => item.id));
        cursor = page.nextCursor ?? undefined;
      } while (cursor !== undefined);
      expect(seen).toHaveLength(6);
      expect(new Set(seen).size).toBe(6);
      expect(seen[0]).toBe(conversations[5]!.id);
      const tied = [conversations[2]!.id, conversations[3]!.id].sort().reverse();
      expect(seen.slice(2, 4)).toEqual(tied);
      expect(seen[5]).toBe(conversations[0]!.id);
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
        await expect(store.listConversations(tenantId, { limit: 5, cursor })).rejects.toMatchObject(
          {
            code: 'BAD_REQUEST',
            field: 'page_id',
            message: 'invalid page_id',
          },
        );
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
      expect(updated!.updatedAt.getTime()).toBeGreaterThanOrEqual(conversation.updatedAt.getTime());
      const metadataOnly = await store.updateConversation(conversation.tenantId, conversation.id, {
        metadata: {},
      });
      expect(metadataOnly).toMatchObject({ title: 'renamed', metadata: {} });
    });

    it('adds usage to the metrics with an update, beside what the events added', async () => {
      const conversation = await created();
      await store.append(conversation.tenantId, conversation.id, [
        {
          ...message('a'),
          metricsDelta: { iterations: 1, prompt_tokens: 10, completion_tokens: 5, cost_usd: 0.25 },
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
      expect(await countEvents(database, conversation.id)).toBe(2);
      expect(await store.deleteConversation(conversation.tenantId, conversation.id)).toBe(true);
      expect(await countEvents(database, conversation.id)).toBe(0);
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
      expect((await store.getConversation(starting.tenantId, starting.id))?.status).toBe('STOPPED');
      expect((await store.getConversation(failed.tenantId, failed.id))?.status).toBe('ERROR');
    });

    it('lists the live conversations idle since before a time, in id order, by page', async () => {
      const live = [await created(), await created(), await created()];
      const [running] = live;
      const stopped = await created();
      const failed = await created();
      const fresh = await created();
      for (const { tenantId, id } of [running!, fresh])
        await store.setStatus(tenantId, id, 'RUNNING');
      for (const { tenantId, id } of live.slice(1)) await store.setStatus(tenantId, id, 'STARTING');
      await store.setStatus(failed.tenantId, failed.id, 'ERROR');
      const idle = [...live, stopped, failed].map((c) => c.id);
      await database.query(
        `UPDATE conversations SET updated_at = updated_at - interval '1 hour' WHERE id = ANY($1::uuid[])`,
        [idle],
      );
      const idleBefore = new Date(Date.now() - 60_000);
      const mine = new Set([...idle, fresh.id]);
      const found: string[] = [];
      const pages: number[] = [];
      for (let afterId: string | null = null; ;) {
        const page = await store.listLiveConversations({ idleBefore, afterId, limit: 2 });
        pages.push(page.length);
        found.push(...page.map((ref) => ref.conversationId).filter((id) => mine.has(id)));
        if (page.length < 2) break;
        afterId = page[page.length - 1]!.conversationId;
      }
      expect(found).toEqual(live.map((c) => c.id).sort());
      expect(pages.every((n) => n <= 2)).toBe(true);
      const ref = (
        await store.listLiveConversations({ idleBefore, afterId: null, limit: 1_000 })
      ).find((r) => r.conversationId === running!.id);
      expect(ref).toEqual({
        tenantId: running!.tenantId,
        userId: running!.userId,
        conversationId: running!.id,
        incarnation: running!.incarnation,
      });
      expect(await store.listLiveConversations({ idleBefore, afterId: 'nope', limit: 10 })).toEqual(
        [],
      );
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
      expect(await store.findEventByClientEventId(tenantId, id, 'key-b')).toEqual(appended!.event);
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
      await expect(store.acquireLease(intruder, id, 'evil')).rejects.toBeInstanceOf(NotFoundError);
      await store.releaseLease(intruder, id, 'owner', 1);
      await expect(
        store.append(intruder, id, [message('x', { stateDelta: { 'user:k': 'evil' } })]),
      ).rejects.toBeInstanceOf(NotFoundError);
      await expect(
        store.append(intruder, id, [message('x')], { leaseEpoch: 0 }),
      ).rejects.toBeInstanceOf(NotFoundError);
      expect(await store.deleteConversation(intruder, id)).toBe(false);

      expect(await store.getSnapshot(conversation.tenantId, id)).toEqual(before);
      expect(await countEvents(database, id)).toBe(1);
      // The intruder's tenant has no state of its own either.
      const { rows } = await database.query<{ n: number }>(
        `SELECT (SELECT count(*) FROM user_states WHERE tenant_id = $1)
              + (SELECT count(*) FROM app_states WHERE tenant_id = $1) AS n`,
        [intruder],
      );
      expect(Number(rows[0]!.n)).toBe(0);
    });
  });
});

describe('appends on Postgres', () => {
  it("update the conversation's row in place (HOT): no index entry per append", async () => {
    const scratch = await createScratchDatabase('cs_hot');
    // One connection: the statistics read below are this backend's own.
    const database = openPostgres(scratch.url, { poolSize: 1 });
    try {
      await migrate(database);
      const store = new PostgresConversationStore(database);
      const { conversation } = await store.createConversation(newConversation());
      for (let i = 0; i < 50; i += 1) {
        await store.append(conversation.tenantId, conversation.id, [
          message(`m${i}`),
          agentStateChanged('running', { stateDelta: { turn: i } }),
        ]);
      }
      await database.query('SELECT pg_stat_force_next_flush()');
      const { rows } = await database.query<{ updates: number; hot: number }>(
        `SELECT n_tup_upd::int AS updates, n_tup_hot_upd::int AS hot
           FROM pg_stat_user_tables WHERE relname = 'conversations'`,
      );
      expect(rows[0]?.updates).toBe(50);
      // Page pruning makes room as it goes; a few may still move to another page.
      expect(rows[0]?.hot).toBeGreaterThanOrEqual(45);
    } finally {
      await database.close();
      await scratch.drop();
    }
  });
});

describe('migrate on Postgres', () => {
  it('applies each migration once when two migrators start at once', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const first = openPostgres(scratch.url, { poolSize: 2 });
    const second = openPostgres(scratch.url, { poolSize: 2 });
    try {
      const [a, b] = await Promise.all([migrate(first), migrate(second)]);
      const all = (await loadMigrations()).map((m) => m.name);
      expect([...a, ...b].sort()).toEqual(all);
      const { rows } = await first.query<{ name: string }>('SELECT name FROM schema_migrations');
      expect(rows.map((row) => row.name).sort()).toEqual(all);
      expect(await migrate(second)).toEqual([]);
    } finally {
      await first.close();
      await second.close();
      await scratch.drop();
    }
  });

  it('applies each migration once when two migrators start at once through PgBouncer', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const bouncer = await startPgBouncer();
    const url = bouncer.urlFor(scratch.url);
    const first = openPostgres(url, { poolSize: 2, preparedStatements: false });
    const second = openPostgres(url, { poolSize: 2, preparedStatements: false });
    try {
      const [a, b] = await Promise.all([migrate(first), migrate(second)]);
      const all = (await loadMigrations()).map((m) => m.name);
      expect([...a, ...b].sort()).toEqual(all);
      const { rows } = await first.query<{ name: string }>('SELECT name FROM schema_migrations');
      expect(rows.map((row) => row.name).sort()).toEqual(all);
    } finally {
      await first.close();
      await second.close();
      await bouncer.stop();
      await scratch.drop();
    }
  });

  it('refuses a migration changed after it was applied', async () => {
    const scratch = await createScratchDatabase('cs_migrate');
    const database = openPostgres(scratch.url, { poolSize: 1 });
    try {
      const migrations = await loadMigrations();
      await migrate(database, migrations);
      const edited = migrations.map((m, i) => (i === 0 ? { ...m, checksum: 'edited' } : m));
      await expect(migrate(database, edited)).rejects.toThrow(/changed after it was applied/);
    } finally {
      await database.close();
      await scratch.drop();
    }
  });
});

describe('the embedded database in DATA_DIR', () => {
  const dirs: string[] = [];
  const scratchDir = () => {
    const dir = mkdtempSync(join(tmpdir(), 'cs-store-'));
    dirs.push(dir);
    return dir;
  };

  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('refuses a second opener while the first keeps serving, and reopens after close', async () => {
    const dataDir = scratchDir();
    const first = await openStore({ dataDir, migrate: true });
    const input = newConversation();
    try {
      expect(first.migrationsApplied).toEqual((await loadMigrations()).map((m) => m.name));
      await first.store.createConversation(input);
      await first.store.append(input.tenantId, input.id, [message('before')]);

      const second = openStore({ dataDir, migrate: true });
      await expect(second).rejects.toBeInstanceOf(DataDirLockedError);
      await expect(second).rejects.toThrow(/another process .*uses the data folder/);
      await expect(second).rejects.toThrow(dataDir);
      await expect(openEmbeddedDatabase(dataDir)).rejects.toBeInstanceOf(DataDirLockedError);

      await first.store.append(input.tenantId, input.id, [message('after')]);
    } finally {
      await first.close();
    }

    const reopened = await openStore({ dataDir, migrate: true });
    try {
      expect(reopened.migrationsApplied).toEqual([]);
      const events = await reopened.store.readEvents(input.tenantId, input.id, { limit: 10 });
      expect(events.map((event) => event.id)).toEqual([0, 1]);
    } finally {
      await reopened.close();
    }
    // Opening a new data folder takes seconds of WebAssembly start-up, twice here.
  }, 180_000);

  it('takes over the lock of a process that died', async () => {
    const dataDir = scratchDir();
    const dead = spawnSync(process.execPath, ['-e', '']).pid;
    abandonLock(dataDir, dead);
    const lock = await lockDataDir(dataDir);
    expect(JSON.parse(readFileSync(join(dataDir, 'lock-owner.json'), 'utf8'))).toMatchObject({
      pid: process.pid,
    });
    await lock.release();
  });

  it('takes over the lock of a zombie process', async () => {
    const dataDir = scratchDir();
    // A parent that never waits for its child: the child stays a zombie until the parent dies.
    const holder = spawn(
      'python3',
      [
        '-c',
        'import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(30)',
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    try {
      const [line] = (await once(holder.stdout, 'data')) as [Buffer];
      const zombie = Number(line.toString().trim());
      await expect.poll(() => procState(zombie)).toBe('Z');
      abandonLock(dataDir, zombie);
      const lock = await lockDataDir(dataDir);
      await lock.release();
    } finally {
      holder.kill('SIGKILL');
    }
  });

  it('leaves the lock of a live process alone', async () => {
    const dataDir = scratchDir();
    // Our parent is alive (vitest's main process).
    abandonLock(dataDir, process.ppid);
    const attempt = lockDataDir(dataDir);
    await expect(attempt).rejects.toBeInstanceOf(DataDirLockedError);
    await expect(attempt).rejects.toMatchObject({ ownerPid: process.ppid });
  });
});

/** What a holder that died without releasing leaves behind. */
function abandonLock(dataDir: string, pid: number | undefined): void {
  mkdirSync(join(dataDir, 'lock'));
  writeFileSync(join(dataDir, 'lock-owner.json'), JSON.stringify({ pid, hostname: hostname() }));
}

function procState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}
