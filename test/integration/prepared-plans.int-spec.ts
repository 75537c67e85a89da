// Every prepared statement of a conversation's life reaches its rows through
// an index (the primary key for `conversations`), whatever the statistics
// say, on real Postgres and on PGlite. Its generic plan (kept by a pooled
// connection once a prepared statement has run five times) is built here on
// small tables that were never analyzed, as on a new deployment or a
// Postgres without autovacuum:
// with `tenant_id = $1 AND id = $2`, the owner index (tenant_id, user_id)
// tied with the primary key there and won, and every append of that
// connection then read all the tenant's conversations; a worker's batch of
// appends checked its idempotency keys with an anti join over every
// partition of events.
import { randomUUID } from 'node:crypto';
import type { EventDraft } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import { PostgresConversationStore } from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { genericPlanNodes, recordingDatabase } from '../support/recorded-statements.js';
import { uniqueName } from '../support/services.js';
import { SQL_BACKENDS } from '../support/sql-backends.js';
import { message, newConversation } from './store.contract.js';

const reply = (cause: number, content: string): EventDraft => ({
  source: 'agent',
  body: { action: 'message', args: { content }, message: content },
  cause,
  answers: cause,
});

describe.each(SQL_BACKENDS.filter((backend) => !backend.name.includes('PgBouncer')))(
  'prepared statements of a conversation on $name',
  (backend) => {
    let database: SqlDatabase;
    let teardown: () => Promise<void>;

    beforeAll(async () => {
      ({ database, teardown } = await backend.open({ migrated: true }));
    });

    afterAll(async () => {
      await teardown?.();
    });

    it('reach its rows through indexes in their generic plans: the primary key, never the owner index, never a whole table', async () => {
      const recorded = recordingDatabase(database);
      const store = new PostgresConversationStore(recorded.database);
      const tenantId = uniqueName('tenant');
      const others: string[] = [];
      for (let i = 0; i < 20; i += 1) {
        const { conversation } = await store.createConversation(
          newConversation({ tenantId, userId: `user-${i % 3}` }),
        );
        others.push(conversation.id);
      }
      const { conversation } = await store.createConversation(newConversation({ tenantId }));
      const { id } = conversation;
      recorded.statements.length = 0;

      const epoch = await store.acquireLease(tenantId, id, 'worker-a');
      await store.setStatus(tenantId, id, 'RUNNING', ['STOPPED', 'STARTING']);
      await store.append(tenantId, id, [message('hello')]);
      await store.append(tenantId, id, [reply(1, 'hi')], { leaseEpoch: epoch });
      // Appends of several conversations at once: a worker's batch in one statement.
      await Promise.all(
        others.map(async (other) => {
          const held = await store.acquireLease(tenantId, other, 'worker-a');
          await store.append(tenantId, other, [reply(0, 'batched')], { leaseEpoch: held });
        }),
      );
      await store.getConversation(tenantId, id);
      await store.getSnapshot(tenantId, id);
      await store.readEvents(tenantId, id, { fromId: 1, limit: 10 });
      await store.readEventPage(tenantId, id, { fromId: 0, limit: 100, maxBytes: 1 << 22 });
      await store.findEventByClientEventId(tenantId, id, 'k1');
      await store.lastEventIds([{ tenantId, conversationId: id }]);
      const days = { from: '2026-01-01', to: '2026-12-31' };
      await store.usageCost(tenantId, { ...days, userId: 'alice' });
      await store.usageReport(tenantId, { ...days, groupBy: 'user' });
      await store.updateConversation(tenantId, id, { title: 'renamed' });
      await store.rewind(tenantId, id, { toEventId: 1, answerAgain: true });
      await store.fork(tenantId, id, { conversationId: randomUUID(), userId: 'bob' });
      await store.releaseLease(tenantId, id, 'worker-a', epoch);
      await store.deleteConversation(tenantId, id);

      // The others are planned with their values each time.
      const prepared = recorded.statements.filter((statement) => statement.prepared);
      expect(prepared.length).toBeGreaterThan(8);
      expect(prepared.some(({ sql }) => sql.includes('jsonb_to_recordset($1'))).toBe(true);
      const indexes = new Set<string>();
      for (const statement of prepared) {
        const nodes = await genericPlanNodes(database, statement);
        for (const node of nodes) if (node['Index Name']) indexes.add(node['Index Name']);
        expect(
          nodes.filter((node) => node['Index Name'] === 'conversations_owner_idx'),
          statement.sql,
        ).toEqual([]);
        // Nothing reads a whole table of conversations, nor a partition of the log.
        expect(
          nodes.filter(
            (node) =>
              node['Node Type'] === 'Seq Scan' &&
              /^(events|conversations|model_usage)/.test(node['Relation Name']!),
          ),
          statement.sql,
        ).toEqual([]);
      }
      expect(indexes).toContain('conversations_pkey');
    });
  },
);
