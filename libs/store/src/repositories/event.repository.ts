/** SQL of the `events` table: the per-conversation logs. */
import type { StoredEvent } from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';

interface EventRow {
  id: number;
  source: StoredEvent['source'];
  payload: Record<string, unknown>;
  cause: number | null;
  client_event_id: string | null;
  created_at: Date;
}

/** An event about to be written, its id assigned. */
export interface NewEventRow {
  id: number;
  source: StoredEvent['source'];
  type: string;
  /** The event body as a JSON object. */
  payload: Record<string, unknown>;
  cause: number | null;
  client_event_id: string | null;
}

/** An event read back with the columns the idempotency check compares. */
export interface StoredEventRow {
  event: StoredEvent;
  source: StoredEvent['source'];
  payload: Record<string, unknown>;
}

export class EventRepository {
  constructor(private readonly db: SqlQueryable) {}

  /** Events of the conversation already stored under these client event ids. */
  async findByClientEventIds(
    tenantId: string,
    conversationId: string,
    clientEventIds: readonly string[],
  ): Promise<Map<string, StoredEventRow>> {
    const { rows } = await this.db.query<EventRow>(
      `SELECT id, source, payload, cause, client_event_id, created_at
         FROM events
        WHERE tenant_id = $1 AND conversation_id = $2 AND client_event_id = ANY($3::text[])`,
      [tenantId, conversationId, clientEventIds],
      PREPARED,
    );
    const found = new Map<string, StoredEventRow>();
    for (const row of rows) {
      if (row.client_event_id === null) continue;
      found.set(row.client_event_id, {
        event: toStoredEvent(row),
        source: row.source,
        payload: row.payload,
      });
    }
    return found;
  }

  /**
   * Writes a burst of events in one statement: the rows travel as one JSON
   * array, the same on pg and PGlite, and all share the append's timestamp.
   */
  async insertMany(
    tenantId: string,
    conversationId: string,
    events: readonly NewEventRow[],
    leaseEpoch: number | null,
    createdAtMicros: string,
  ): Promise<void> {
    await this.db.query(
      `INSERT INTO events
         (conversation_id, id, tenant_id, source, type, payload, cause, client_event_id,
          lease_epoch, created_at)
       SELECT $1::uuid, e.id, $2::text, e.source, e.type, e.payload, e.cause, e.client_event_id,
              $4::bigint, timestamptz 'epoch' + $5::bigint * interval '1 microsecond'
         FROM jsonb_to_recordset($3::jsonb)
           AS e(id bigint, source text, type text, payload jsonb, cause bigint,
                client_event_id text)`,
      [conversationId, tenantId, JSON.stringify(events), leaseEpoch, createdAtMicros],
      PREPARED,
    );
  }

  /** Inclusive `fromId` … `toId` (open when null), oldest or newest first. */
  async readRange(
    tenantId: string,
    conversationId: string,
    fromId: number,
    toId: number | null,
    reverse: boolean,
    limit: number,
  ): Promise<StoredEvent[]> {
    const params = [tenantId, conversationId, fromId, toId, limit];
    const { rows } = reverse
      ? await this.db.query<EventRow>(
          `SELECT id, source, payload, cause, client_event_id, created_at
             FROM events
            WHERE tenant_id = $1 AND conversation_id = $2
              AND id >= $3 AND ($4::bigint IS NULL OR id <= $4::bigint)
            ORDER BY id DESC
            LIMIT $5`,
          params,
          PREPARED,
        )
      : await this.db.query<EventRow>(
          `SELECT id, source, payload, cause, client_event_id, created_at
             FROM events
            WHERE tenant_id = $1 AND conversation_id = $2
              AND id >= $3 AND ($4::bigint IS NULL OR id <= $4::bigint)
            ORDER BY id ASC
            LIMIT $5`,
          params,
          PREPARED,
        );
    return rows.map(toStoredEvent);
  }
}

/** The wire shape: envelope, then the body; `cause` and `client_event_id` only when set. */
export function toStoredEvent(row: {
  id: number;
  source: StoredEvent['source'];
  payload: Record<string, unknown>;
  cause: number | null;
  client_event_id: string | null;
  created_at: Date;
}): StoredEvent {
  return {
    id: row.id,
    timestamp: row.created_at.toISOString(),
    source: row.source,
    ...row.payload,
    ...(row.cause === null ? {} : { cause: row.cause }),
    ...(row.client_event_id === null ? {} : { client_event_id: row.client_event_id }),
  } as StoredEvent;
}
