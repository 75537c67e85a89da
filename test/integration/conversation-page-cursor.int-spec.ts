// The `page_id` cursor of conversation lists through the store, on real
// Postgres and on PGlite: a cursor the server could not have made is
// BAD_REQUEST naming page_id, never a query error (a negative one overflowed
// the timestamp arithmetic of the page query: a 500), and every cursor it
// accepts runs.
import { BadRequestError, type ConversationStore } from '@cs/core';
import type { SqlDatabase } from '@cs/store';
import { PostgresConversationStore, encodeCursor, migrate, openPostgres } from '@cs/store';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMigratedPglite } from '../support/migrated-template.js';
import { createEchoConversation, createScratchDatabase, uniqueName } from '../support/services.js';

const backends = [
  {
    name: 'Postgres',
    async open(): Promise<{ database: SqlDatabase; teardown(): Promise<void> }> {
      const scratch = await createScratchDatabase('cs_cursor', { migrated: true });
      const database = openPostgres(scratch.url, { poolSize: 2 });
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
    async open(): Promise<{ database: SqlDatabase; teardown(): Promise<void> }> {
      const database = await openMigratedPglite();
      return { database, teardown: () => database.close() };
    },
  },
];

describe.each(backends)('conversation page cursors on $name', (backend) => {
  let store: ConversationStore;
  let teardown: () => Promise<void>;
  const owner = { tenantId: uniqueName('tenant'), userId: 'alice' };
  const ids: string[] = [];

  beforeAll(async () => {
    const opened = await backend.open();
    teardown = opened.teardown;
    await migrate(opened.database);
    store = new PostgresConversationStore(opened.database);
    for (let n = 0; n < 3; n += 1) {
      ids.push((await createEchoConversation(store, owner)).conversationId);
    }
  });

  afterAll(async () => {
    await teardown();
  });

  const list = (cursor: string) =>
    store.listConversations(owner.tenantId, { userId: owner.userId, limit: 10, cursor });

  it('refuses negative and non-canonical cursors as BAD_REQUEST on page_id', async () => {
    const id = ids[0]!;
    const refused = [
      encodeCursor({ updatedAtMicros: '-999999999999999999', id }),
      encodeCursor({ updatedAtMicros: '-1', id }),
      encodeCursor({ updatedAtMicros: '007', id }),
      encodeCursor({ updatedAtMicros: '1', id: id.toUpperCase() }),
      'not-a-cursor',
    ];
    for (const cursor of refused) {
      const error: unknown = await list(cursor).then(
        () => new Error(`${cursor} was accepted`),
        (thrown: unknown) => thrown,
      );
      expect(error, cursor).toBeInstanceOf(BadRequestError);
      expect(error).toMatchObject({ code: 'BAD_REQUEST', field: 'page_id' });
    }
  });

  it('runs every cursor it accepts, from 1970 to the 18-digit bound', async () => {
    const id = ids[0]!;
    // Nothing is older than 1970; everything is older than the year 33658.
    expect((await list(encodeCursor({ updatedAtMicros: '0', id }))).items).toEqual([]);
    const all = await list(encodeCursor({ updatedAtMicros: '999999999999999999', id }));
    expect(all.items.map((item) => item.id).sort()).toEqual([...ids].sort());
  });
});
