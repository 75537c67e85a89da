export * from './conversation-page.cursor.js';
export * from './database/data-dir.lock.js';
export * from './database/embedded.database.js';
export * from './database/pglite.database.js';
export * from './database/postgres.database.js';
export * from './database/sql-database.js';
export { PostgresConversationStore } from './postgres-conversation.store.js';
export {
  HOUR_ORIGIN,
  IDLE_CONVERSATIONS_SQL,
  PostgresDataLifecycleStore,
} from './postgres-data-lifecycle.store.js';
export * from './schema.migrator.js';
export * from './store.factory.js';
export * from './write-clock.js';
export { PostgresWebhookOutbox } from './postgres-webhook.outbox.js';
