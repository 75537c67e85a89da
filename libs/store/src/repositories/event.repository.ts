/**
 * SQL that reads the `events` table, the per-conversation logs: pages and
 * ranges, idempotency keys, unanswered messages. The appends are
 * `EventAppendRepository`'s.
 */
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
  undone_by: number | null;
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
      `SELECT id, source, payload, cause, client_event_id, created_at, undone_by
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

  /** True when a user message is stored after `afterId` (a turn still to come). */
  /** How many user messages come after `afterId`, counted up to `upTo`. */
  async countUserMessagesAfter(
    conversationId: string,
    afterId: number,
    upTo: number,
  ): Promise<number> {
    const { rows } = await this.db.query<{ count: number }>(
      `SELECT count(*)::int AS count FROM (
         SELECT 1 FROM events
          WHERE conversation_id = $1 AND id > $2 AND source = 'user' AND type = 'message'
          LIMIT $3
       ) AS found`,
      [conversationId, afterId, upTo],
      PREPARED,
    );
    return rows[0]?.count ?? 0;
  }

  /**
   * One page of `fromId` … `toId` (inclusive; open when null), oldest or
   * newest first: at most `limit` events and, past the first, `maxBytes` of
   * payload; `hasMore` when the range holds more. With `incarnation`, only
   * while the conversation of that id is still that one (nothing otherwise).
   */
  async readPage(
    tenantId: string,
    conversationId: string,
    range: {
      fromId: number;
      toId: number | null;
      reverse: boolean;
      limit: number;
      maxBytes: number;
      incarnation: string | null;
    },
  ): Promise<{ events: StoredEvent[]; hasMore: boolean }> {
    const { rows } = await this.db.query<EventRow & { kept: boolean }>(
      range.reverse ? PAGE_DESC : PAGE_ASC,
      [
        tenantId,
        conversationId,
        range.fromId,
        range.toId,
        range.limit,
        range.maxBytes,
        range.incarnation,
      ],
      PREPARED,
    );
    const kept = rows.filter((row) => row.kept);
    return { events: kept.map(toStoredEvent), hasMore: kept.length < rows.length };
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
          `SELECT id, source, payload, cause, client_event_id, created_at, undone_by
             FROM events
            WHERE tenant_id = $1 AND conversation_id = $2
              AND id >= $3 AND ($4::bigint IS NULL OR id <= $4::bigint)
            ORDER BY id DESC
            LIMIT $5`,
          params,
          PREPARED,
        )
      : await this.db.query<EventRow>(
          `SELECT id, source, payload, cause, client_event_id, created_at, undone_by
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

/**
 * A page of `readPage`: rows of one direction, each with the bytes of the
 * range up to and including it; rows past the page's end (kept = false)
 * carry no payload, and only say that more exist.
 */
const PAGE_SQL = (direction: 'ASC' | 'DESC') => `
  SELECT id, source, cause, client_event_id, created_at, undone_by,
         CASE WHEN kept THEN payload END AS payload, kept
    FROM (
      SELECT *, (n <= $5 AND (n = 1 OR upto <= $6)) AS kept
        FROM (
          SELECT e.id, e.source, e.payload, e.cause, e.client_event_id, e.created_at, e.undone_by,
                 row_number() OVER w AS n,
                 sum(coalesce(e.size_bytes, octet_length(e.payload::text))) OVER w AS upto
            FROM events e
           WHERE e.tenant_id = $1 AND e.conversation_id = $2
             AND e.id >= $3 AND ($4::bigint IS NULL OR e.id <= $4::bigint)
             AND ($7::uuid IS NULL OR EXISTS (
               SELECT 1 FROM conversations c WHERE c.id = $2 AND c.incarnation = $7::uuid))
          WINDOW w AS (ORDER BY e.id ${direction} ROWS UNBOUNDED PRECEDING)
           ORDER BY e.id ${direction}
           LIMIT $5 + 1
        ) counted
    ) marked
   ORDER BY id ${direction}`;
const PAGE_ASC = PAGE_SQL('ASC');
const PAGE_DESC = PAGE_SQL('DESC');

/**
 * The wire shape: envelope, then the body; `cause`, `client_event_id` and
 * `undone_by` only when set.
 */
export function toStoredEvent(row: {
  id: number;
  source: StoredEvent['source'];
  payload: Record<string, unknown>;
  cause: number | null;
  client_event_id: string | null;
  created_at: Date;
  undone_by?: number | string | null;
}): StoredEvent {
  return {
    id: row.id,
    timestamp: row.created_at.toISOString(),
    source: row.source,
    ...row.payload,
    ...(row.cause === null ? {} : { cause: row.cause }),
    ...(row.client_event_id === null ? {} : { client_event_id: row.client_event_id }),
    ...(row.undone_by === null || row.undone_by === undefined
      ? {}
      : { undone_by: Number(row.undone_by) }),
  } as StoredEvent;
}
