// The data lifecycle's store (migration 0011) on real Postgres and on PGlite:
// retention's idle search goes through the activity-hour index (EXPLAIN) and
// that index leaves an append's update HOT; erasures are stored jobs (one
// running per user, leases that expire, done only once the user holds
// nothing); deletions write their erasure count and audit record in their
// own transaction; the audit trail pages newest first.
import { randomUUID } from 'node:crypto';
import type { EventDraft, NewConversation } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import {
  HOUR_ORIGIN,
  IDLE_CONVERSATIONS_SQL,
  PostgresConversationStore,
  PostgresDataLifecycleStore,
  migrate,
} from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';
import { SQL_BACKENDS } from '../support/sql-backends.js';

function conversation(tenantId: string, userId: string): NewConversation {
  return {
    id: randomUUID(),
    tenantId,
    userId,
    appName: 'default',
    title: '',
    metadata: {},
    agent: { name: 'echo', config: {} },
    instructions: null,
  };
}

function message(content: string): EventDraft {
  return {
    source: 'user',
    body: { action: 'message', args: { content, image_urls: [], file_urls: [] }, message: content },
  };
}

/** Index names in a JSON plan. */
function indexesOf(plan: unknown): string[] {
  const found: string[] = [];
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) node.forEach(walk);
    else if (typeof node === 'object' && node !== null) {
      for (const [key, value] of Object.entries(node)) {
        if (key === 'Index Name' && typeof value === 'string') found.push(value);
        else walk(value);
      }
    }
  };
  walk(typeof plan === 'string' ? JSON.parse(plan) : plan);
  return found;
}

describe.each(SQL_BACKENDS)('PostgresDataLifecycleStore ($name)', (backend) => {
  let database: SqlDatabase;
  let teardown: () => Promise<void>;
  let store: PostgresConversationStore;
  let lifecycle: PostgresDataLifecycleStore;

  beforeAll(async () => {
    ({ database, teardown } = await backend.open({ migrated: true }));
    await migrate(database);
    store = new PostgresConversationStore(database);
    lifecycle = new PostgresDataLifecycleStore(database);
  });

  afterAll(async () => {
    await teardown?.();
  });

  it('finds idle conversations through the activity-hour index (EXPLAIN), and not those whose user came back', async () => {
    const tenant = uniqueName('t');
    // Many recently active conversations, a few idle for 40 days.
    await database.query(
      `INSERT INTO conversations (id, tenant_id, user_id, app_name, agent, created_at, updated_at)
       SELECT gen_random_uuid(), $1, 'u' || (g % 50), 'default', '{"name":"echo","config":{}}',
              now() - interval '1 hour' * (g % 24), now() - interval '1 minute' * (g % 600)
         FROM generate_series(1, 5000) g`,
      [tenant],
    );
    const idle = await database.query<{ id: string }>(
      `INSERT INTO conversations (id, tenant_id, user_id, app_name, agent, created_at, updated_at)
       SELECT gen_random_uuid(), $1, 'old', 'default', '{"name":"echo","config":{}}',
              now() - interval '41 days', now() - interval '40 days' - interval '1 minute' * g
         FROM generate_series(1, 20) g
       RETURNING id`,
      [tenant],
    );
    await database.query('ANALYZE conversations');
    const cutoff = new Date(Date.now() - 30 * 86_400_000);
    const { rows } = await database.query<Record<string, unknown>>(
      `EXPLAIN (FORMAT JSON) ${IDLE_CONVERSATIONS_SQL}`,
      [cutoff.toISOString(), HOUR_ORIGIN, 50],
    );
    expect(indexesOf(rows[0]?.['QUERY PLAN'])).toContain('conversations_activity_hour_idx');

    const found = await lifecycle.findIdleConversations(cutoff, 50);
    expect(found.map((row) => row.conversationId).sort()).toEqual(
      idle.rows.map((row) => row.id).sort(),
    );
    // A batch is a batch.
    expect(await lifecycle.findIdleConversations(cutoff, 7)).toHaveLength(7);
    // The one whose user comes back is not idle any more.
    const [first] = idle.rows;
    await store.append(tenant, first!.id, [message('back')]);
    expect(
      (await lifecycle.findIdleConversations(cutoff, 50)).map((row) => row.conversationId),
    ).not.toContain(first!.id);
  });

  it('deletes for retention only while no user event came after the one seen idle', async () => {
    const tenant = uniqueName('t');
    const { conversation: a } = await store.createConversation(conversation(tenant, 'u'), [
      message('one'),
    ]);
    const { conversation: b } = await store.createConversation(conversation(tenant, 'u'), [
      message('one'),
    ]);
    // A user message after the search: it stays.
    await store.append(tenant, a.id, [message('two')]);
    expect(await lifecycle.deleteConversation(tenant, a.id, { idleThroughEventId: 0 })).toBe(false);
    expect(await store.getConversation(tenant, a.id)).not.toBeNull();
    // An agent event (a stop's state change) does not count.
    await store.append(tenant, b.id, [
      {
        source: 'environment',
        body: {
          observation: 'agent_state_changed',
          content: '',
          extras: { agent_state: 'stopped' },
          message: '',
        },
      },
    ]);
    expect(await lifecycle.deleteConversation(tenant, b.id, { idleThroughEventId: 0 })).toBe(true);
    expect(await store.getConversation(tenant, b.id)).toBeNull();
    const { rows } = await database.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM events WHERE conversation_id = $1',
      [b.id],
    );
    expect(rows[0]?.n).toBe(0);
    // Another incarnation of an id is not the one asked for.
    expect(await lifecycle.deleteConversation(tenant, a.id, { incarnation: randomUUID() })).toBe(
      false,
    );
  });

  it('keeps one running erasure per user, counts its deletions, and finishes it only once the user holds nothing', async () => {
    const tenant = uniqueName('t');
    const user = uniqueName('u');
    const { conversation: mine } = await store.createConversation(conversation(tenant, user));
    await database.query(
      `INSERT INTO user_states (tenant_id, app_name, user_id, state) VALUES ($1, 'default', $2, '{"color":"red"}')`,
      [tenant, user],
    );
    const audit = { actor: user, action: 'user.erase' };
    const now = new Date();
    const lease = new Date(now.getTime() + 10_000);
    // Stored leased to the runner of the process that took the request.
    const first = await lifecycle.startErasure(tenant, user, audit, now, {
      owner: 'a',
      until: lease,
    });
    const again = await lifecycle.startErasure(tenant, user, audit, now, {
      owner: 'b',
      until: lease,
    });
    expect(first.created).toBe(true);
    expect(again).toEqual({ erasure: first.erasure, created: false });
    const id = first.erasure.id;
    expect(await lifecycle.getErasure(uniqueName('other'), id)).toBeNull();
    // Nobody else gets it while the lease lasts.
    expect(await lifecycle.claimErasure('b', now, lease, id)).toBeNull();
    expect(await lifecycle.claimErasure('b', now, lease)).toBeNull();
    expect(await lifecycle.finishErasure(id, 'a', new Date())).toBe(false); // a conversation is left
    expect(await lifecycle.deleteConversation(tenant, mine.id, { erasureId: id })).toBe(true);
    expect(await lifecycle.deleteConversation(tenant, mine.id, { erasureId: id })).toBe(false);
    await lifecycle.deleteUserState(tenant, user);
    expect(await lifecycle.getUserState(tenant, 'default', user)).toEqual({});
    // Runner a died: past its lease, b takes it over, and a cannot finish it any more.
    const later = new Date(lease.getTime() + 1);
    expect((await lifecycle.claimErasure('b', later, new Date(later.getTime() + 10_000)))?.id).toBe(
      id,
    );
    expect(await lifecycle.renewErasure(id, 'a', new Date(later.getTime() + 20_000))).toBe(false);
    expect(await lifecycle.finishErasure(id, 'a', new Date())).toBe(false);
    await lifecycle.eraseFromAudit(tenant, user);
    expect(await lifecycle.finishErasure(id, 'b', new Date())).toBe(true);
    expect(await lifecycle.getErasure(tenant, id)).toEqual({
      id,
      tenantId: tenant,
      userId: null,
      status: 'done',
      conversationsDeleted: 1,
    });
    // Nothing of the user is left in the tables.
    for (const table of ['conversations', 'user_states', 'erasures']) {
      const { rows } = await database.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM ${table} WHERE user_id = $1`,
        [user],
      );
      expect(rows[0]?.n, table).toBe(0);
    }
    const records = await lifecycle.listAudit(tenant, 100);
    expect(records.records.map((r) => [r.actor, r.action, r.target])).toEqual([
      ['erased', 'user.erase', 'user:erased'],
    ]);
    // Done: a new erasure of the user is a new one.
    const lease2 = { owner: 'c', until: new Date(Date.now() + 10_000) };
    expect((await lifecycle.startErasure(tenant, user, audit, new Date(), lease2)).created).toBe(
      true,
    );
  });

  it('writes an audit record in the transaction of the delete, and pages the trail newest first', async () => {
    const tenant = uniqueName('t');
    const { conversation: c } = await store.createConversation(conversation(tenant, 'owner'));
    await lifecycle.deleteConversation(tenant, c.id, {
      audit: {
        tenantId: tenant,
        actor: 'admin',
        action: 'conversation.delete',
        target: `conversation:${c.id}`,
      },
    });
    for (let n = 0; n < 4; n += 1) {
      await lifecycle.recordAudit(
        { tenantId: tenant, actor: 'admin', action: 'user.export', target: `user:u${n}` },
        new Date(),
      );
    }
    await lifecycle.recordAudit(
      { tenantId: uniqueName('other'), actor: 'x', action: 'user.export', target: 'user:y' },
      new Date(),
    );
    const targets: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await lifecycle.listAudit(tenant, 2, cursor);
      targets.push(...page.records.map((record) => record.target));
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
    expect(targets).toEqual(['user:u3', 'user:u2', 'user:u1', 'user:u0', `conversation:${c.id}`]);
    await expect(lifecycle.listAudit(tenant, 2, '-1')).rejects.toMatchObject({
      code: 'BAD_REQUEST',
    });
  });

  it("moves an erased user's usage onto `erased`, added to what is there, and deletes the user's webhook deliveries", async () => {
    const tenant = uniqueName('t');
    const usage = (costUsd: number) => ({
      model: 'm',
      promptTokens: 10,
      completionTokens: 2,
      costUsd,
      requests: 1,
    });
    const { conversation: gone } = await store.createConversation(conversation(tenant, 'gone'));
    const { conversation: kept } = await store.createConversation(conversation(tenant, 'kept'));
    await store.updateConversation(tenant, gone.id, { addUsage: usage(1.5) });
    await store.updateConversation(tenant, kept.id, { addUsage: usage(2) });
    // A row an earlier erasure left on `erased` for the same key.
    const today = new Date().toISOString().slice(0, 10);
    await database.query(
      `INSERT INTO model_usage (tenant_id, user_id, day, model, conversation_id,
                                prompt_tokens, completion_tokens, cost_usd, requests)
       VALUES ($1, 'erased', $2, 'm', $3, 5, 1, 0.25, 1)`,
      [tenant, today, gone.id],
    );
    for (const [c, user] of [
      [gone, 'gone'],
      [kept, 'kept'],
    ] as const) {
      await database.query(
        `INSERT INTO webhook_deliveries (conversation_id, endpoint_url, tenant_id, user_id, type,
                                         occurred_at, data, status)
         VALUES ($1, 'http://127.0.0.1:1/hook', $2, $3, 'turn.completed', now(), '{}', 'delivered'),
                ($1, 'http://127.0.0.1:1/hook', $2, $3, 'conversation.deleted', now(), '{}', 'pending')`,
        [c.id, tenant, user],
      );
    }

    await lifecycle.eraseFromUsage(tenant, 'gone');
    await lifecycle.deleteUserWebhookDeliveries(tenant, 'gone');
    // Idempotent: a resumed erasure runs every step again.
    await lifecycle.eraseFromUsage(tenant, 'gone');
    await lifecycle.deleteUserWebhookDeliveries(tenant, 'gone');

    const rows = await database.query<{ user_id: string; cost_usd: string; requests: string }>(
      `SELECT user_id, cost_usd::text, requests::text FROM model_usage
        WHERE tenant_id = $1 ORDER BY user_id`,
      [tenant],
    );
    expect(rows.rows).toEqual([
      { user_id: 'erased', cost_usd: '1.75', requests: '2' },
      { user_id: 'kept', cost_usd: '2', requests: '1' },
    ]);
    const deliveries = await database.query<{ user_id: string; n: string }>(
      `SELECT user_id, count(*)::text AS n FROM webhook_deliveries
        WHERE tenant_id = $1 GROUP BY user_id`,
      [tenant],
    );
    expect(deliveries.rows).toEqual([{ user_id: 'kept', n: '2' }]);
  });
});
