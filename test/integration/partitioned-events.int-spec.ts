// `events` hash-partitioned by conversation_id (migration 0007), on real
// Postgres and on PGlite: the migration keeps every row of a database built at
// the migration before it, and EXPLAIN shows that each statement of the hot
// path touches one partition. A second layout, with `conversations`
// partitioned by id as well, stands in for Citus shards (not installed here):
// there every hot statement touches one partition of each table, as a Citus
// router query touches one shard.
import { randomUUID } from 'node:crypto';
import type { EventDraft, NewConversation } from '@cs/core';
import { AgentBusyError } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import {
  PostgresConversationStore,
  loadMigrations,
  migrate,
  openPglite,
  openPostgres,
} from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMigratedPglite } from '../support/migrated-template.js';
import { type Recorded, recordingDatabase, relationsOf } from '../support/recorded-statements.js';
import { createScratchDatabase, uniqueName } from '../support/services.js';

const PARTITIONING = '0007_partitioned_events';

interface Backend {
  name: string;
  /** A new database, empty or (`migrated`) a copy of the migrated template. */
  open(options?: { migrated?: boolean }): Promise<{
    database: SqlDatabase;
    teardown(): Promise<void>;
  }>;
}

const backends: Backend[] = [
  {
    name: 'Postgres',
    async open(options) {
      const scratch = await createScratchDatabase('cs_partitions', options);
      const database = openPostgres(scratch.url, { poolSize: 4 });
      return {
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
    async open(options) {
      const database = options?.migrated ? await openMigratedPglite() : await openPglite(undefined);
      return { database, teardown: () => database.close() };
    },
  },
];

function newConversation(tenantId: string): NewConversation {
  return {
    id: randomUUID(),
    tenantId,
    userId: 'alice',
    appName: 'chat',
    title: 'a conversation',
    metadata: {},
    agent: { name: 'echo', config: {} },
    instructions: null,
  };
}

function message(content: string, extra: Partial<EventDraft> = {}): EventDraft {
  return {
    source: 'user',
    body: { action: 'message', args: { content, image_urls: [], file_urls: [] }, message: content },
    ...extra,
  };
}

function reply(cause: number, content: string, stateDelta?: Record<string, unknown>): EventDraft {
  return {
    source: 'agent',
    body: { action: 'message', args: { content }, message: content },
    cause,
    metricsDelta: { iterations: 1, prompt_tokens: 3, completion_tokens: 2, cost_usd: 0.01 },
    ...(stateDelta ? { stateDelta } : {}),
  };
}

/** Conversations with logs, keys, causes, lease epochs and state, as a store in use holds them. */
async function useConversations(database: SqlDatabase) {
  const store = new PostgresConversationStore(database);
  const tenantId = uniqueName('tenant');
  const conversations = [];
  for (let i = 0; i < 24; i += 1) {
    const { conversation } = await store.createConversation(newConversation(tenantId));
    conversations.push(conversation);
    const epoch = await store.acquireLease(tenantId, conversation.id, `worker-${i}`);
    for (let turn = 0; turn < 1 + (i % 4); turn += 1) {
      const [sent] = await store.append(tenantId, conversation.id, [
        message(`m${i}.${turn}`, { clientEventId: `c${i}.${turn}` }),
      ]);
      await store.append(
        tenantId,
        conversation.id,
        [reply(sent!.event.id, `echo ${i}.${turn}`, { turn, 'user:seen': i })],
        { leaseEpoch: epoch },
      );
    }
  }
  return { conversations, tenantId };
}

/** Every row of `table` as JSON text, in key order: what must survive the migration. */
async function rowsOf(database: SqlDatabase, table: string, order: string): Promise<string[]> {
  const { rows } = await database.query<{ row: string }>(
    `SELECT to_jsonb(t)::text AS row FROM ${table} t ORDER BY ${order}`,
  );
  return rows.map((row) => row.row);
}

describe.each(backends)('partitioned events on $name', (backend) => {
  describe('migration 0007', () => {
    let database: SqlDatabase;
    let teardown: () => Promise<void>;

    beforeAll(async () => {
      ({ database, teardown } = await backend.open());
    });

    afterAll(async () => {
      await teardown?.();
    });

    it('moves every row and id of an existing database into 16 partitions', async () => {
      const migrations = await loadMigrations();
      const before = migrations.filter((m) => m.name < PARTITIONING);
      expect(migrations.map((m) => m.name)).toContain(PARTITIONING);
      await migrate(database, before);

      // A database in use: conversations with logs, keys, causes, epochs and
      // state, written by today's store on a database of its own, then put into
      // this one as its schema before the partitioning holds them (the columns
      // later migrations added are left out).
      const source = await backend.open({ migrated: true });
      const { conversations, tenantId } = await (async () => {
        await migrate(source.database);
        const seeded = await useConversations(source.database);
        for (const table of ['conversations', 'events', 'app_states', 'user_states']) {
          const { rows } = await source.database.query<{ rows: unknown[] }>(
            `SELECT coalesce(jsonb_agg(to_jsonb(t)), '[]') AS rows FROM ${table} t`,
          );
          await database.query(
            `INSERT INTO ${table} SELECT * FROM jsonb_populate_recordset(null::${table}, $1::jsonb)`,
            [JSON.stringify(rows[0]!.rows)],
          );
        }
        return seeded;
      })().finally(() => source.teardown());
      // Rows written before sizes were recorded (migration 0004) have none.
      await database.query(
        'UPDATE events SET size_bytes = NULL WHERE conversation_id = $1 AND id = 0',
        [conversations[0]!.id],
      );
      const events = await rowsOf(database, 'events', 'conversation_id, id');
      const heads = await rowsOf(database, 'conversations', 'id');
      expect(events.length).toBeGreaterThan(24 * 2);

      // Up to the partitioning only: later migrations may add columns to the rows compared.
      const through = migrations.filter((m) => m.name <= PARTITIONING);
      expect(await migrate(database, through)).toEqual([PARTITIONING]);

      expect(await rowsOf(database, 'events', 'conversation_id, id')).toEqual(events);
      expect(await rowsOf(database, 'conversations', 'id')).toEqual(heads);
      const { rows: layout } = await database.query<{ partitions: number; strategy: string }>(
        `SELECT (SELECT count(*)::int FROM pg_inherits WHERE inhparent = 'events'::regclass)
                  AS partitions,
                (SELECT partstrat::text FROM pg_partitioned_table
                  WHERE partrelid = 'events'::regclass) AS strategy`,
      );
      expect(layout[0]).toEqual({ partitions: 16, strategy: 'h' });
      // Each conversation's log lies in one partition; together they use several.
      const { rows: placed } = await database.query<{ conversation_id: string; n: number }>(
        `SELECT conversation_id, count(DISTINCT tableoid)::int AS n FROM events
          GROUP BY conversation_id`,
      );
      expect(placed.map((row) => row.n)).toEqual(conversations.map(() => 1));
      const { rows: used } = await database.query<{ n: number }>(
        'SELECT count(DISTINCT tableoid)::int AS n FROM events',
      );
      expect(used[0]!.n).toBeGreaterThan(4);

      // The later migrations apply on top; the log goes on where it stopped,
      // its keys and its cascade still hold.
      await migrate(database);
      const store = new PostgresConversationStore(database);
      const first = conversations[0]!;
      const appended = await store.append(tenantId, first.id, [
        message('m0.0', { clientEventId: 'c0.0' }),
        message('new'),
      ]);
      // Its one turn stored events 0 and 1.
      expect(appended.map((a) => [a.event.id, a.duplicate])).toEqual([
        [0, true],
        [2, false],
      ]);
      expect(await store.deleteConversation(tenantId, first.id)).toBe(true);
      const { rows: left } = await database.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM events WHERE conversation_id = $1',
        [first.id],
      );
      expect(left[0]!.n).toBe(0);
    });
  });

  describe.each([
    { layout: 'events partitioned', shardConversations: false },
    { layout: 'conversations partitioned too, as Citus shards', shardConversations: true },
  ])('EXPLAIN of the hot path ($layout)', ({ shardConversations }) => {
    let database: SqlDatabase;
    let teardown: () => Promise<void>;

    beforeAll(async () => {
      ({ database, teardown } = await backend.open({ migrated: true }));
      await migrate(database);
      if (shardConversations) await partitionConversations(database);
    });

    afterAll(async () => {
      await teardown?.();
    });

    it('touches one partition of each table in every statement', async () => {
      const recorded = recordingDatabase(database);
      const store = new PostgresConversationStore(recorded.database);
      const tenantId = uniqueName('tenant');
      // Neighbours in other partitions, which no statement below may touch.
      for (let i = 0; i < 16; i += 1) {
        const { conversation } = await store.createConversation(newConversation(tenantId));
        await store.append(tenantId, conversation.id, [message(`neighbour ${i}`)]);
      }
      const { conversation } = await store.createConversation(newConversation(tenantId));
      const { id, incarnation } = conversation;
      recorded.statements.length = 0;

      const ops: Record<string, () => Promise<unknown>> = {
        lease: async () => {
          const epoch = await store.acquireLease(tenantId, id, 'worker-a');
          await store.releaseLease(tenantId, id, 'worker-a', epoch);
          await store.acquireLease(tenantId, id, 'worker-a');
        },
        'status update': () => store.setStatus(tenantId, id, 'RUNNING', ['STOPPED', 'STARTING']),
        append: () => store.append(tenantId, id, [message('hello'), reply(0, 'hi')]),
        'append with a key, in a transaction': () =>
          store.append(tenantId, id, [
            message('again', { clientEventId: 'k1' }),
            reply(2, 'again', { 'user:tz': 'UTC', 'app:mode': 'x' }),
          ]),
        'append refused while busy': () =>
          store
            .append(tenantId, id, [message('third')], { defaultMultitaskStrategy: 'reject' })
            .catch((error) => {
              if (!(error instanceof AgentBusyError)) throw error;
            }),
        'idempotent repeat': () => store.findEventByClientEventId(tenantId, id, 'k1'),
        'replay page': () =>
          store.readEventPage(tenantId, id, { fromId: 0, limit: 100, maxBytes: 1 << 22 }),
        'replay page of one incarnation, newest first': () =>
          store.readEventPage(tenantId, id, {
            fromId: 0,
            limit: 2,
            maxBytes: 1 << 22,
            reverse: true,
            incarnation,
          }),
        'history range': () => store.readEvents(tenantId, id, { fromId: 1, limit: 10 }),
        'state read': () => store.getSnapshot(tenantId, id),
        'conversation read': () => store.getConversation(tenantId, id),
        update: () => store.updateConversation(tenantId, id, { title: 'renamed' }),
      };
      const byOp = new Map<string, Recorded[]>();
      for (const [name, op] of Object.entries(ops)) {
        await op();
        byOp.set(name, recorded.statements.splice(0));
      }

      const { rows: homes } = await database.query<{ relation: string }>(
        'SELECT DISTINCT tableoid::regclass::text AS relation FROM events WHERE conversation_id = $1',
        [id],
      );
      // Every event of the conversation went to one partition.
      expect(homes).toHaveLength(1);
      const eventsHome = homes[0]!.relation;
      const conversationsHome = shardConversations
        ? (
            await database.query<{ relation: string }>(
              'SELECT tableoid::regclass::text AS relation FROM conversations WHERE id = $1',
              [id],
            )
          ).rows[0]!.relation
        : 'conversations';

      const seen = new Set<string>();
      for (const [name, statements] of byOp) {
        expect(statements.length, name).toBeGreaterThan(0);
        for (const statement of statements) {
          const touched = await relationsOf(database, statement);
          const partitions = touched.filter((relation) => /_p\d\d$/.test(relation));
          for (const relation of touched) seen.add(relation);
          // Scans name the partitions they read; a write names its table as well.
          expect(
            partitions.filter((p) => p !== eventsHome && p !== conversationsHome),
            `${name}: ${statement.sql}`,
          ).toEqual([]);
        }
      }
      // The statements above did read the log through its partition.
      expect(seen).toContain(eventsHome);
      if (shardConversations) expect(seen).toContain(conversationsHome);
    });
  });
});

/**
 * `conversations` hash-partitioned by id into 16 partitions, beside `events`
 * by conversation_id: the co-location Citus gives the two tables.
 */
async function partitionConversations(database: SqlDatabase): Promise<void> {
  const partitions = Array.from(
    { length: 16 },
    (_, i) =>
      `CREATE TABLE conversations_p${String(i).padStart(2, '0')} PARTITION OF conversations
         FOR VALUES WITH (MODULUS 16, REMAINDER ${i});`,
  ).join('\n');
  // The table as the migrations made it (columns, defaults, generated columns,
  // indexes), hash-partitioned by id.
  await database.transaction((tx) =>
    tx.exec(`
      ALTER TABLE events DROP CONSTRAINT events_conversation_id_fkey;
      CREATE TABLE conversations_sharded (LIKE conversations INCLUDING ALL)
        PARTITION BY HASH (id);
      ${partitions.replaceAll('PARTITION OF conversations', 'PARTITION OF conversations_sharded')}
      DROP TABLE conversations CASCADE;
      ALTER TABLE conversations_sharded RENAME TO conversations;
      ALTER TABLE events ADD CONSTRAINT events_conversation_id_fkey
        FOREIGN KEY (conversation_id) REFERENCES conversations (id) ON DELETE CASCADE;
    `),
  );
}
