// The webhook outbox against real Postgres (a scratch database) and PGlite:
// deliveries written by the store's own writes, in their transaction, and
// handed out in order per (conversation, endpoint).
import { randomUUID } from 'node:crypto';
import type {
  ClaimedWebhookDelivery,
  ConversationStore,
  EventDraft,
  NewConversation,
  WebhookAttemptOutcome,
  WebhookOutbox,
} from '@cs/core';
import { LeaseLostError } from '@cs/core';
import type { QueryOptions, SqlDatabase, SqlTransaction } from '@cs/store';
import { PostgresConversationStore, PostgresWebhookOutbox, migrate } from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';
import { SQL_BACKENDS } from '../support/sql-backends.js';

const ALL = 'http://127.0.0.1:1/all';
const TURNS = 'http://127.0.0.1:1/turns';

function newConversation(tenantId: string): NewConversation {
  return {
    id: randomUUID(),
    tenantId,
    userId: 'alice',
    appName: 'chat',
    title: 'hooked',
    metadata: {},
    agent: { name: 'echo', config: {} },
    instructions: null,
  };
}

const userMessage = (content: string): EventDraft => ({
  source: 'user',
  body: { action: 'message', args: { content, image_urls: [], file_urls: [] }, message: content },
});

const answer = (cause: number, content: string, extra: Partial<EventDraft> = {}): EventDraft => ({
  source: 'agent',
  body: { action: 'message', args: { content }, message: content },
  cause,
  answers: cause,
  ...extra,
});

const stateChanged = (cause: number, agentState: string, reason?: string): EventDraft => ({
  source: 'environment',
  body: {
    observation: 'agent_state_changed',
    content: '',
    extras: { agent_state: agentState, ...(reason ? { reason } : {}) },
    message: '',
  },
  cause,
});

const toolCall = (cause: number, id: string): EventDraft => ({
  source: 'agent',
  body: {
    action: 'tool_call',
    args: { tool: 'current_time', arguments: {}, tool_call_id: id },
    message: '',
  },
  cause,
});

/** The database, counting the statements sent through it. */
function counting(database: SqlDatabase): { database: SqlDatabase; statements: () => number } {
  let statements = 0;
  return {
    statements: () => statements,
    database: {
      backend: database.backend,
      query<T>(sql: string, params?: readonly unknown[], options?: QueryOptions) {
        statements += 1;
        return database.query<T>(sql, params, options);
      },
      transaction: (fn) =>
        database.transaction((tx) =>
          fn({
            query<T>(sql: string, params?: readonly unknown[], options?: QueryOptions) {
              statements += 1;
              return tx.query<T>(sql, params, options);
            },
            exec: (script) => {
              statements += 1;
              return tx.exec(script);
            },
          }),
        ),
      close: () => database.close(),
    },
  };
}

describe.each(SQL_BACKENDS)('PostgresWebhookOutbox on $name', (backend) => {
  let database: SqlDatabase;
  let store: ConversationStore;
  let outbox: WebhookOutbox;
  let teardown: () => Promise<void>;
  let turnsTenant: string;

  beforeAll(async () => {
    ({ database, teardown } = await backend.open({ migrated: true }));
    await migrate(database);
    store = new PostgresConversationStore(database);
    outbox = new PostgresWebhookOutbox(database);
    turnsTenant = uniqueName('turns');
    await outbox.syncEndpoints([
      { url: ALL },
      { url: TURNS, events: ['turn.completed'], tenants: [turnsTenant] },
    ]);
  });

  afterAll(async () => {
    await teardown?.();
  });

  /** One attempt recorded on its own. */
  async function record(delivery: ClaimedWebhookDelivery, outcome: WebhookAttemptOutcome) {
    return (await outbox.recordAttempts([{ delivery, outcome }]))[0];
  }

  async function deliveries(conversationId: string) {
    const { rows } = await database.query<{
      endpoint_url: string;
      type: string;
      data: Record<string, unknown>;
      seq: number;
      user_id: string;
      tenant_id: string;
    }>(
      `SELECT endpoint_url, type, data, seq, user_id, tenant_id FROM webhook_deliveries
        WHERE conversation_id = $1 ORDER BY seq`,
      [conversationId],
    );
    return rows;
  }

  /** A running session's writes: under the lease epoch. */
  async function hosted(tenantId: string) {
    const { conversation } = await store.createConversation(newConversation(tenantId));
    const epoch = await store.acquireLease(tenantId, conversation.id, 'worker-1');
    const [stored] = await store.append(tenantId, conversation.id, [userMessage('hello')]);
    return { id: conversation.id, epoch, messageId: stored!.event.id };
  }

  it('enqueues creation, status changes and deletion in the order they were written', async () => {
    const tenantId = uniqueName('tenant');
    const { conversation } = await store.createConversation(newConversation(tenantId));
    await store.setStatus(tenantId, conversation.id, 'STARTING');
    await store.setStatus(tenantId, conversation.id, 'STARTING'); // no change, no message
    await store.setStatus(tenantId, conversation.id, 'RUNNING');
    await store.deleteConversation(tenantId, conversation.id);

    const rows = await deliveries(conversation.id);
    // The turns endpoint takes only turn.completed of its tenant.
    expect(rows.every((row) => row.endpoint_url === ALL)).toBe(true);
    expect(rows.map((row) => [row.type, row.data])).toEqual([
      ['conversation.created', { title: 'hooked', status: 'STOPPED' }],
      ['conversation.status_changed', { status: 'STARTING', previous_status: 'STOPPED' }],
      ['conversation.status_changed', { status: 'RUNNING', previous_status: 'STARTING' }],
      ['conversation.deleted', {}],
    ]);
    expect(rows.every((row) => row.user_id === 'alice' && row.tenant_id === tenantId)).toBe(true);
  });

  it('enqueues turn.completed with the answer and the turn usage, for each matching endpoint', async () => {
    const { id, epoch, messageId } = await hosted(turnsTenant);
    await store.append(
      turnsTenant,
      id,
      [
        answer(messageId, 'echo: hello', {
          metricsDelta: { iterations: 1, prompt_tokens: 12, completion_tokens: 3, cost_usd: 0.25 },
        }),
        stateChanged(messageId, 'awaiting_user_input'),
      ],
      { leaseEpoch: epoch },
    );
    const completed = (await deliveries(id)).filter((row) => row.type === 'turn.completed');
    expect(completed.map((row) => row.endpoint_url).sort()).toEqual([ALL, TURNS]);
    expect(completed[0]!.data).toEqual({
      event_id: messageId,
      answer_event_id: messageId + 1,
      content: 'echo: hello',
      usage: { prompt_tokens: 12, completion_tokens: 3, cost_usd: 0.25 },
    });
  });

  it('counts the usage of every step of the turn, and only of that turn', async () => {
    const tenantId = uniqueName('tenant');
    const { id, epoch, messageId } = await hosted(tenantId);
    const usage = { iterations: 1, prompt_tokens: 10, completion_tokens: 5, cost_usd: 0.5 };
    await store.append(tenantId, id, [{ ...toolCall(messageId, 'c1'), metricsDelta: usage }], {
      leaseEpoch: epoch,
    });
    await store.append(tenantId, id, [answer(messageId, 'one', { metricsDelta: usage })], {
      leaseEpoch: epoch,
    });
    const [second] = await store.append(tenantId, id, [userMessage('again')]);
    // A turn without usage (the echo agent) reports zeros, not the last turn's.
    await store.append(tenantId, id, [answer(second!.event.id, 'two')], { leaseEpoch: epoch });
    const completed = (await deliveries(id)).filter((row) => row.type === 'turn.completed');
    expect(completed.map((row) => row.data.usage)).toEqual([
      { prompt_tokens: 20, completion_tokens: 10, cost_usd: 1 },
      { prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 },
    ]);
  });

  it('tells nothing of interrupted text, of imported history, nor of a write that was refused', async () => {
    const tenantId = uniqueName('tenant');
    const { id, epoch, messageId } = await hosted(tenantId);
    await store.append(
      tenantId,
      id,
      [
        {
          ...answer(messageId, 'half'),
          body: { action: 'message', args: { content: 'half', interrupted: true }, message: '' },
        },
      ],
      { leaseEpoch: epoch },
    );
    await expect(
      store.append(tenantId, id, [answer(messageId, 'late')], { leaseEpoch: epoch - 1 }),
    ).rejects.toBeInstanceOf(LeaseLostError);
    // replay_json: an answer stored with the conversation, by no session.
    const replayed = newConversation(tenantId);
    await store.createConversation(replayed, [userMessage('old'), answer(0, 'old answer')]);

    expect((await deliveries(id)).map((row) => row.type)).toEqual(['conversation.created']);
    expect((await deliveries(replayed.id)).map((row) => row.type)).toEqual([
      'conversation.created',
    ]);
  });

  it("tells nothing of a fork's copy of its source's turns, and of the fork's own turns as of any", async () => {
    const tenantId = uniqueName('tenant');
    const { id, epoch, messageId } = await hosted(tenantId);
    await store.append(
      tenantId,
      id,
      [answer(messageId, 'echo: hello'), stateChanged(messageId, 'awaiting_user_input')],
      { leaseEpoch: epoch },
    );
    const forkId = randomUUID();
    await store.fork(tenantId, id, { conversationId: forkId, userId: 'alice' });
    expect((await deliveries(forkId)).map((row) => row.type)).toEqual(['conversation.created']);

    // The fork's own session then answers as any conversation does.
    const forkEpoch = await store.acquireLease(tenantId, forkId, 'worker-1');
    const [next] = await store.append(tenantId, forkId, [userMessage('again')]);
    await store.append(tenantId, forkId, [answer(next!.event.id, 'echo: again')], {
      leaseEpoch: forkEpoch,
    });
    const completed = (await deliveries(forkId)).filter((row) => row.type === 'turn.completed');
    expect(completed.map((row) => row.data.answer_event_id)).toEqual([next!.event.id + 1]);
  });

  it('enqueues turn.failed with the reason and approval.requested with the calls awaiting it', async () => {
    const tenantId = uniqueName('tenant');
    const { id, epoch, messageId } = await hosted(tenantId);
    const stored = await store.append(
      tenantId,
      id,
      [
        toolCall(messageId, 'call-a'),
        toolCall(messageId, 'call-b'),
        stateChanged(messageId, 'awaiting_user_confirmation'),
      ],
      { leaseEpoch: epoch },
    );
    await store.append(tenantId, id, [stateChanged(messageId, 'error', 'max_iterations')], {
      leaseEpoch: epoch,
    });
    const rows = (await deliveries(id)).slice(1);
    expect(rows.map((row) => [row.type, row.data])).toEqual([
      [
        'approval.requested',
        {
          event_id: messageId,
          tool_calls: [
            {
              tool: 'current_time',
              arguments: {},
              tool_call_id: 'call-a',
              event_id: stored[0]!.event.id,
            },
            {
              tool: 'current_time',
              arguments: {},
              tool_call_id: 'call-b',
              event_id: stored[1]!.event.id,
            },
          ],
        },
      ],
      ['turn.failed', { event_id: messageId, reason: 'max_iterations' }],
    ]);
  });

  it('writes the deliveries of appends batched across conversations', async () => {
    const tenantId = uniqueName('tenant');
    const hosts = await Promise.all([1, 2, 3, 4, 5].map(() => hosted(tenantId)));
    await Promise.all(
      hosts.map((host) =>
        store.append(tenantId, host.id, [answer(host.messageId, `to ${host.id}`)], {
          leaseEpoch: host.epoch,
        }),
      ),
    );
    for (const host of hosts) {
      const completed = (await deliveries(host.id)).filter((row) => row.type === 'turn.completed');
      expect(completed.map((row) => row.data.content)).toEqual([`to ${host.id}`]);
    }
  });

  describe('handing out', () => {
    it('hands out only the oldest pending delivery of each conversation, once', async () => {
      const tenantId = uniqueName('tenant');
      const a = await store.createConversation(newConversation(tenantId));
      await store.setStatus(tenantId, a.conversation.id, 'STARTING');
      const b = await store.createConversation(newConversation(tenantId));
      const mine = <T extends { conversationId: string }>(rows: T[]) =>
        rows.filter((row) => [a.conversation.id, b.conversation.id].includes(row.conversationId));

      const first = mine(
        await outbox.claimDue({ endpointUrls: [ALL], limit: 100, claimMs: 60_000 }),
      );
      expect(first.map((row) => [row.conversationId, row.type]).sort()).toEqual(
        [
          [a.conversation.id, 'conversation.created'],
          [b.conversation.id, 'conversation.created'],
        ].sort(),
      );
      // Claimed: nobody else gets them, and a's next waits behind its head.
      expect(
        mine(await outbox.claimDue({ endpointUrls: [ALL], limit: 100, claimMs: 60_000 })),
      ).toEqual([]);

      const headOfA = first.find((row) => row.conversationId === a.conversation.id)!;
      const retryAt = new Date(Date.now() + 60_000);
      expect(await record(headOfA, { delivered: false, error: 'HTTP 500', retryAt })).toBe(
        'pending',
      );
      // Waiting for its retry, the head still holds the conversation's line.
      expect(
        mine(await outbox.claimDue({ endpointUrls: [ALL], limit: 100, claimMs: 60_000 })),
      ).toEqual([]);
      // A stale claim records nothing.
      expect(await record(headOfA, { delivered: true })).toBe('delivered');
      const next = mine(
        await outbox.claimDue({ endpointUrls: [ALL], limit: 100, claimMs: 60_000 }),
      );
      expect(next.map((row) => [row.conversationId, row.type])).toEqual([
        [a.conversation.id, 'conversation.status_changed'],
      ]);
      expect(next[0]!.seq).toBeGreaterThan(headOfA.seq);
    });

    it('hands out, when asked for some conversations, the heads of theirs alone', async () => {
      const tenantId = uniqueName('tenant');
      const ids: string[] = [];
      for (let i = 0; i < 3; i += 1) {
        const { conversation } = await store.createConversation(newConversation(tenantId));
        await store.setStatus(tenantId, conversation.id, 'STARTING');
        ids.push(conversation.id);
      }
      const [first, second, third] = ids as [string, string, string];
      const claimOf = (conversationIds: string[]) =>
        outbox.claimDue({ endpointUrls: [ALL], limit: 100, claimMs: 60_000, conversationIds });

      const heads = await claimOf([first, third, 'not-a-uuid']);
      expect(heads.map((row) => [row.conversationId, row.type]).sort()).toEqual(
        [
          [first, 'conversation.created'],
          [third, 'conversation.created'],
        ].sort(),
      );
      // The head of each queue only: the status changes wait behind the claimed heads.
      expect(await claimOf([first, third])).toEqual([]);
      expect(await claimOf(['not-a-uuid'])).toEqual([]);
      expect(await claimOf([])).toEqual([]);
      for (const head of heads) expect(await record(head, { delivered: true })).toBe('delivered');
      expect((await claimOf([first])).map((row) => [row.conversationId, row.type])).toEqual([
        [first, 'conversation.status_changed'],
      ]);
      // Untouched by the targeted claims, the second's head is still there for a claim from all.
      const fromAll = (
        await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs: 60_000 })
      ).filter((row) => ids.includes(row.conversationId));
      expect(fromAll.map((row) => [row.conversationId, row.type]).sort()).toEqual(
        [
          [second, 'conversation.created'],
          [third, 'conversation.status_changed'],
        ].sort(),
      );
    });

    it('records the outcomes of many attempts in one statement, each as its claim allows', async () => {
      const tenantId = uniqueName('tenant');
      const ids: string[] = [];
      for (let i = 0; i < 12; i += 1) {
        const { conversation } = await store.createConversation(newConversation(tenantId));
        // A second delivery waits behind each head.
        await store.setStatus(tenantId, conversation.id, 'STARTING');
        ids.push(conversation.id);
      }
      const heads = (
        await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs: 60_000 })
      ).filter((row) => ids.includes(row.conversationId));
      expect(heads.map((row) => row.type)).toEqual(Array(12).fill('conversation.created'));

      const retryAt = new Date(Date.now() + 60_000);
      const outcomes: WebhookAttemptOutcome[] = [
        ...Array<WebhookAttemptOutcome>(6).fill({ delivered: true }),
        ...Array<WebhookAttemptOutcome>(3).fill({ delivered: false, error: 'HTTP 503', retryAt }),
        ...Array<WebhookAttemptOutcome>(3).fill({
          delivered: false,
          error: 'HTTP 410',
          retryAt: null,
        }),
      ];
      // The last failure's claim lapsed and was taken over meanwhile: it records nothing.
      const records = heads.map((delivery, i) => ({
        delivery: i === 11 ? { ...delivery, claim: randomUUID() } : delivery,
        outcome: outcomes[i]!,
      }));
      const counted = counting(database);
      const statuses = await new PostgresWebhookOutbox(counted.database).recordAttempts(records);

      expect(counted.statements()).toBe(1);
      expect(statuses).toEqual([
        ...Array(6).fill('delivered'),
        ...Array(3).fill('pending'),
        ...Array(2).fill('failed'),
        null,
      ]);
      const { rows } = await database.query<{
        id: string;
        status: string;
        attempts: number;
        last_error: string | null;
        next_attempt_at: Date | null;
        delivered_at: Date | null;
        claim: string | null;
      }>(
        `SELECT id, status, attempts, last_error, next_attempt_at, delivered_at, claim
           FROM webhook_deliveries WHERE id = ANY ($1::uuid[])`,
        [heads.map((row) => row.id)],
      );
      const byId = new Map(rows.map((row) => [row.id, row]));
      const state = heads.map((row) => {
        const stored = byId.get(row.id)!;
        return [
          stored.status,
          stored.attempts,
          stored.last_error,
          stored.next_attempt_at?.getTime() ?? null,
          stored.delivered_at !== null,
          stored.claim === null,
        ];
      });
      expect(state).toEqual([
        ...Array(6).fill(['delivered', 1, null, null, true, true]),
        ...Array(3).fill(['pending', 1, 'HTTP 503', retryAt.getTime(), false, true]),
        ...Array(2).fill(['failed', 1, 'HTTP 410', null, false, true]),
        ['pending', 0, null, null, false, false],
      ]);

      // Behind a delivered or failed head, the next is due; behind the others, not yet.
      const next = (
        await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs: 60_000 })
      ).filter((row) => ids.includes(row.conversationId));
      expect(next.map((row) => row.conversationId).sort()).toEqual(
        [...ids.slice(0, 6), ...ids.slice(9, 11)].sort(),
      );
      expect(next.every((row) => row.type === 'conversation.status_changed')).toBe(true);
    });

    it('claims and records without waiting for the WAL to reach the disk, in their own transaction alone', async () => {
      const tenantId = uniqueName('tenant');
      const { conversation } = await store.createConversation(newConversation(tenantId));
      const setting = async (tx: SqlTransaction) =>
        (await tx.query<{ value: string }>(`SELECT current_setting('synchronous_commit') AS value`))
          .rows[0]!.value;
      /** The outbox on one transaction's connection, and the setting after its call. */
      const within = <T>(call: (outbox: WebhookOutbox) => Promise<T>) =>
        database.transaction(async (tx) => {
          const inTransaction = new PostgresWebhookOutbox({
            backend: database.backend,
            query: (sql, params, options) => tx.query(sql, params, options),
            transaction: () => Promise.reject(new Error('not in this test')),
            close: () => Promise.resolve(),
          });
          const before = await setting(tx);
          const result = await call(inTransaction);
          return { before, after: await setting(tx), result };
        });
      const claimed = await within((txOutbox) =>
        txOutbox.claimDue({
          endpointUrls: [ALL],
          limit: 10,
          claimMs: 60_000,
          conversationIds: [conversation.id],
        }),
      );
      expect(claimed.result.map((row) => row.type)).toEqual(['conversation.created']);
      expect([claimed.before, claimed.after]).toEqual(['on', 'off']);
      const recorded = await within((txOutbox) =>
        txOutbox.recordAttempts([{ delivery: claimed.result[0]!, outcome: { delivered: true } }]),
      );
      expect(recorded.result).toEqual(['delivered']);
      expect([recorded.before, recorded.after]).toEqual(['on', 'off']);
      // Nothing else is relaxed: the setting went with those transactions.
      const { rows } = await database.query<{ value: string }>(
        `SELECT current_setting('synchronous_commit') AS value`,
      );
      expect(rows[0]!.value).toBe('on');
    });

    it('hands a delivery whose claim lapsed to another dispatcher, and ignores the old one', async () => {
      const tenantId = uniqueName('tenant');
      const { conversation } = await store.createConversation(newConversation(tenantId));
      const pick = async (claimMs: number) =>
        (await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs })).filter(
          (row) => row.conversationId === conversation.id,
        );
      const [lapsed] = await pick(1);
      expect(lapsed).toBeDefined();
      await new Promise((resolve) => setTimeout(resolve, 5));
      const [taken] = await pick(60_000);
      expect(taken?.id).toBe(lapsed!.id);
      expect(await record(lapsed!, { delivered: false, error: 'x', retryAt: null })).toBeNull();
      expect(await record(taken!, { delivered: true })).toBe('delivered');
    });

    it('never hands one delivery to two dispatchers claiming at once', async () => {
      const tenantId = uniqueName('tenant');
      const ids = new Set<string>();
      for (let i = 0; i < 20; i += 1) {
        ids.add((await store.createConversation(newConversation(tenantId))).conversation.id);
      }
      const claims = await Promise.all(
        [1, 2, 3, 4].map(() =>
          outbox.claimDue({ endpointUrls: [ALL], limit: 10, claimMs: 60_000 }),
        ),
      );
      const handed = claims.flat().filter((row) => ids.has(row.conversationId));
      expect(new Set(handed.map((row) => row.id)).size).toBe(handed.length);
    });

    it('fails a delivery for good, lists it to its tenant only, and sends it again on retry', async () => {
      const tenantId = uniqueName('tenant');
      const { conversation } = await store.createConversation(newConversation(tenantId));
      await store.setStatus(tenantId, conversation.id, 'STARTING');
      const [head] = (
        await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs: 60_000 })
      ).filter((row) => row.conversationId === conversation.id);
      expect(await record(head!, { delivered: false, error: 'HTTP 410', retryAt: null })).toBe(
        'failed',
      );

      const failed = await outbox.listDeliveries({ tenantId, status: 'failed', limit: 10 });
      expect(failed.items.map((item) => [item.id, item.attempts, item.lastError])).toEqual([
        [head!.id, 1, 'HTTP 410'],
      ]);
      const firstPage = await outbox.listDeliveries({ tenantId, limit: 1 });
      expect(firstPage.items.map((item) => item.type)).toEqual(['conversation.status_changed']);
      const secondPage = await outbox.listDeliveries({
        tenantId,
        limit: 1,
        cursor: firstPage.nextCursor!,
      });
      expect(secondPage.items.map((item) => item.type)).toEqual(['conversation.created']);
      expect(secondPage.nextCursor).toBeNull();
      expect((await outbox.listDeliveries({ tenantId: 'other', limit: 10 })).items).toEqual([]);

      expect(await outbox.retryDelivery('other', head!.id)).toBe('not_found');
      const pending = firstPage.items[0]!;
      expect(await outbox.retryDelivery(tenantId, pending.id)).toBe('not_failed');
      const retried = await outbox.retryDelivery(tenantId, head!.id);
      expect(retried).toMatchObject({ id: head!.id, status: 'pending', attempts: 0 });
      const [again] = (
        await outbox.claimDue({ endpointUrls: [ALL], limit: 1000, claimMs: 60_000 })
      ).filter((row) => row.conversationId === conversation.id);
      expect(again?.id).toBe(head!.id);
    });

    it('refuses a page_id it did not make', async () => {
      await expect(
        outbox.listDeliveries({ tenantId: 't', limit: 1, cursor: 'bm90LWEtY3Vyc29y' }),
      ).rejects.toMatchObject({ code: 'BAD_REQUEST', field: 'page_id' });
    });
  });
});
