// The ConversationStore contract against the Postgres store on each database
// it runs on: a scratch Postgres, the same through PgBouncer, and PGlite.
import { PostgresConversationStore, migrate, type SqlDatabase } from '@cs/store';
import { SQL_BACKENDS } from '../support/sql-backends.js';
import { conversationStoreContract } from './store.contract.js';

async function countEvents(database: SqlDatabase, conversationId: string): Promise<number> {
  const { rows } = await database.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM events WHERE conversation_id = $1',
    [conversationId],
  );
  return rows[0]!.n;
}

for (const backend of SQL_BACKENDS) {
  conversationStoreContract(`PostgresConversationStore on ${backend.name}`, async () => {
    const { database, teardown } = await backend.open({ migrated: true });
    await migrate(database);
    return {
      store: new PostgresConversationStore(database),
      countEvents: (conversationId) => countEvents(database, conversationId),
      async leaseEpochs(conversationId) {
        const { rows } = await database.query<{ lease_epoch: number | null }>(
          'SELECT lease_epoch FROM events WHERE conversation_id = $1 ORDER BY id',
          [conversationId],
        );
        return rows.map((row) => row.lease_epoch);
      },
      teardown,
    };
  });
}
