/**
 * How the apps get a store: Postgres when a URL is configured, else the
 * embedded database in the data folder; migrated first when asked.
 */
import type { ConversationStore, DataLifecycleStore, WebhookOutbox } from '@cs/core';
import type { DataDirLockOptions } from './database/data-dir.lock.js';
import { openEmbeddedDatabase } from './database/embedded.database.js';
import { openPostgres } from './database/postgres.database.js';
import type { SqlDatabase } from './database/sql-database.js';
import { PostgresConversationStore } from './postgres-conversation.store.js';
import { PostgresWebhookOutbox } from './postgres-webhook.outbox.js';
import { PostgresDataLifecycleStore } from './postgres-data-lifecycle.store.js';
import { migrate } from './schema.migrator.js';

export interface StoreOptions {
  /** Postgres connection string; the embedded database in `dataDir` when absent. */
  databaseUrl?: string | undefined;
  dataDir: string;
  /** Apply pending migrations before returning. */
  migrate: boolean;
  /** pg pool size (default 10). */
  poolSize?: number;
  /** Named prepared statements on pg (default true); see `PostgresOptions`. */
  preparedStatements?: boolean;
  /** Appends of several conversations share statements (default true); see `ConversationStoreOptions`. */
  crossConversationBatches?: boolean;
  /** Errors of idle pooled Postgres connections. */
  onIdleError?: (error: Error) => void;
  /** When the embedded database's folder lock is lost; see `DataDirLockOptions`. */
  onDataDirCompromised?: DataDirLockOptions['onCompromised'];
}

export interface OpenedStore {
  store: ConversationStore;
  /** The webhook deliveries the store's writes enqueue (docs/protocol.md "Webhooks"). */
  webhooks: WebhookOutbox;
  /** Retention, erasures and the audit trail, on the same database. */
  lifecycle: DataLifecycleStore;
  database: SqlDatabase;
  /** Migrations this call applied, in order. */
  migrationsApplied: string[];
  close(): Promise<void>;
}

/** Throws `DataDirLockedError` when another process uses the embedded database's folder. */
export async function openStore(options: StoreOptions): Promise<OpenedStore> {
  const database = options.databaseUrl
    ? openPostgres(options.databaseUrl, {
        ...(options.poolSize === undefined ? {} : { poolSize: options.poolSize }),
        ...(options.preparedStatements === undefined
          ? {}
          : { preparedStatements: options.preparedStatements }),
        ...(options.onIdleError ? { onIdleError: options.onIdleError } : {}),
      })
    : await openEmbeddedDatabase(
        options.dataDir,
        options.onDataDirCompromised ? { onCompromised: options.onDataDirCompromised } : {},
      );
  try {
    const migrationsApplied = options.migrate ? await migrate(database) : [];
    return {
      store: new PostgresConversationStore(database, {
        ...(options.crossConversationBatches === undefined
          ? {}
          : { crossConversationBatches: options.crossConversationBatches }),
      }),
      webhooks: new PostgresWebhookOutbox(database),
      lifecycle: new PostgresDataLifecycleStore(database),
      database,
      migrationsApplied,
      close: () => database.close(),
    };
  } catch (error) {
    await database.close();
    throw error;
  }
}
