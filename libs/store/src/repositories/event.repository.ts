/** SQL of the `events` table: the per-conversation logs. */
import type { ConversationMetrics, StoredEvent } from '@cs/protocol';
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

/** Where a one-statement append put its events: the first id and the shared timestamp. */
export interface AppendedHead {
  firstId: number;
  at: Date;
}

/** A plain append: conversation-scope state, metrics and agent state ride along on the row. */
export interface LogAppend {
  tenantId: string;
  conversationId: string;
  /**
   * The events as a JSON array of `NewEventRow`s (see `eventRowsJson`), each
   * `id` an offset (0, 1, …) from the first id, which the row's last_event_id gives.
   */
  rowsJson: string;
  count: number;
  leaseEpoch: number | null;
  agentState: string | null;
  stateSet: string;
  stateDeleted: string[];
  metrics: ConversationMetrics;
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
   * array of `NewEventRow`s, the same on pg and PGlite, and all share the
   * append's timestamp.
   */
  async insertMany(
    tenantId: string,
    conversationId: string,
    rowsJson: string,
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
      [conversationId, tenantId, rowsJson, leaseEpoch, createdAtMicros],
      PREPARED,
    );
  }

  /**
   * The whole append in one statement, outside any transaction: the UPDATE
   * locks the conversation row (checking the lease epoch there), moves
   * last_event_id on by the number of events and merges state and metrics;
   * the INSERT takes its ids from what the UPDATE returned. Null when no row
   * matched (no such conversation, or a newer lease epoch). A client_event_id
   * already stored fails the statement with a unique violation and writes
   * nothing: the caller then takes the transaction that tells repeats apart.
   */
  async appendToLog(append: LogAppend): Promise<AppendedHead | null> {
    const { rows } = await this.db.query<{ first_id: number; updated_at: Date }>(
      `WITH head AS (
         UPDATE conversations
            SET last_event_id = last_event_id + $3::int,
                agent_state = coalesce($5::text, agent_state),
                state = (state || $6::jsonb) - $7::text[],
                metrics = jsonb_build_object(
                  'iterations', coalesce((metrics ->> 'iterations')::numeric, 0) + $8::numeric,
                  'prompt_tokens', coalesce((metrics ->> 'prompt_tokens')::numeric, 0) + $9::numeric,
                  'completion_tokens',
                    coalesce((metrics ->> 'completion_tokens')::numeric, 0) + $10::numeric,
                  'cost_usd', coalesce((metrics ->> 'cost_usd')::numeric, 0) + $11::numeric),
                updated_at = greatest(updated_at, clock_timestamp())
          WHERE tenant_id = $1 AND id = $2
            AND ($4::bigint IS NULL OR lease_epoch = $4::bigint)
          RETURNING last_event_id - $3::int + 1 AS first_id, updated_at
       ), written AS (
         INSERT INTO events
           (conversation_id, id, tenant_id, source, type, payload, cause, client_event_id,
            lease_epoch, created_at)
         SELECT $2::uuid, head.first_id + e.id, $1::text, e.source, e.type, e.payload, e.cause,
                e.client_event_id, $4::bigint, head.updated_at
           FROM head,
                jsonb_to_recordset($12::jsonb)
                  AS e(id bigint, source text, type text, payload jsonb, cause bigint,
                       client_event_id text)
       )
       SELECT first_id, updated_at FROM head`,
      [
        append.tenantId,
        append.conversationId,
        append.count,
        append.leaseEpoch,
        append.agentState,
        append.stateSet,
        append.stateDeleted,
        append.metrics.iterations,
        append.metrics.prompt_tokens,
        append.metrics.completion_tokens,
        append.metrics.cost_usd,
        append.rowsJson,
      ],
      PREPARED,
    );
    const row = rows[0];
    return row ? { firstId: row.first_id, at: row.updated_at } : null;
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
