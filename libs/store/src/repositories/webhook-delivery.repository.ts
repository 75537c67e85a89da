/** SQL of the webhook outbox: `webhook_endpoints` and `webhook_deliveries` (migration 0009). */
import type { WebhookDeliveryStatus, WebhookEventType } from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';

export interface WebhookDeliveryRow {
  id: string;
  conversation_id: string;
  endpoint_url: string;
  seq: number;
  tenant_id: string;
  user_id: string;
  type: WebhookEventType;
  occurred_at: Date;
  data: Record<string, unknown>;
  status: WebhookDeliveryStatus;
  attempts: number;
  last_error: string | null;
  created_at: Date;
  delivered_at: Date | null;
  claim: string | null;
}

const COLUMNS = `d.id, d.conversation_id, d.endpoint_url, d.seq, d.tenant_id, d.user_id, d.type,
  d.occurred_at, d.data, d.status, d.attempts, d.last_error, d.created_at, d.delivered_at, d.claim`;

/**
 * A one-row relation that makes the statement it joins commit without
 * waiting for its WAL to be flushed (`synchronous_commit` off for that
 * transaction alone, so that it holds behind PgBouncer in transaction mode).
 * For the dispatchers' own bookkeeping, claims and outcomes: lost with a
 * crash of Postgres, a delivery is only sent again, with its webhook-id
 * (at least once), and in order, since the WAL loses a suffix: an outcome
 * lost takes the later claims behind it with it. A delivery itself is
 * written by the statement that causes it, whose commit waits as ever. It
 * spares each a flush: about a tenth of a millisecond of CPU here, a third
 * of what such a statement costs Postgres.
 */
const RELAXED_COMMIT = `(SELECT set_config('synchronous_commit', 'off', true)) AS relaxed_commit`;

export interface EndpointRow {
  url: string;
  events: string[] | null;
  tenants: string[] | null;
}

/** One attempt's outcome as `recordOutcomes` takes it. */
export interface AttemptOutcomeRow {
  conversation_id: string;
  endpoint_url: string;
  seq: number;
  /** The attempt's claim. */
  claim: string;
  delivered: boolean;
  /** Null when delivered. */
  error: string | null;
  /** A failure's next attempt; null: failed for good (and when delivered). */
  retry_at: Date | null;
}

export interface RecordedRow {
  conversation_id: string;
  endpoint_url: string;
  seq: number;
  status: WebhookDeliveryStatus;
}

export class WebhookDeliveryRepository {
  constructor(private readonly db: SqlQueryable) {}

  /** Removes the endpoints not in `urls`. */
  async deleteEndpointsExcept(urls: readonly string[]): Promise<void> {
    await this.db.query('DELETE FROM webhook_endpoints WHERE NOT (url = ANY ($1::text[]))', [urls]);
  }

  async upsertEndpoint(endpoint: EndpointRow): Promise<void> {
    await this.db.query(
      `INSERT INTO webhook_endpoints (url, events, tenants) VALUES ($1, $2::text[], $3::text[])
       ON CONFLICT (url) DO UPDATE SET events = EXCLUDED.events, tenants = EXCLUDED.tenants
        WHERE webhook_endpoints.events IS DISTINCT FROM EXCLUDED.events
           OR webhook_endpoints.tenants IS DISTINCT FROM EXCLUDED.tenants`,
      [endpoint.url, endpoint.events, endpoint.tenants],
    );
  }

  async listEndpoints(): Promise<EndpointRow[]> {
    const { rows } = await this.db.query<EndpointRow>(
      'SELECT url, events, tenants FROM webhook_endpoints ORDER BY url',
    );
    return rows;
  }

  /**
   * Claims the heads of the (conversation, endpoint) queues that are due, the
   * oldest first: a pending delivery with no pending one before it in its
   * queue, whose retry time has come and which no live claim holds.
   * `FOR UPDATE … SKIP LOCKED` with the conditions checked again on the
   * locked row: two dispatchers never claim one delivery.
   *
   * With `conversationIds`, only those conversations' queues, each found
   * through the index of pending deliveries by queue: the cost follows those
   * conversations alone. Without, the walk goes in `seq` order on the index of
   * every pending delivery (the head test is one probe of the queue's index
   * per row), so that the cost follows the rows handed out rather than the
   * backlog; but that index also keeps an entry for each delivery sent since
   * the table was last vacuumed, which every walk steps over, so dispatchers
   * take it on their poll and use the targeted claim after their own writes.
   * Not a prepared statement: each claim is planned with its values and the
   * table's size at the time (a generic plan kept from when the table was
   * small could walk that index for the targeted claim too).
   *
   * Committed without waiting for the WAL to reach the disk (see
   * `RELAXED_COMMIT`).
   */
  async claimDue(
    endpointUrls: readonly string[],
    now: Date,
    until: Date,
    claim: string,
    limit: number,
    conversationIds: readonly string[] | null = null,
  ): Promise<WebhookDeliveryRow[]> {
    const params: unknown[] = [endpointUrls, now.toISOString(), until.toISOString(), claim, limit];
    if (conversationIds) params.push(conversationIds);
    const { rows } = await this.db.query<WebhookDeliveryRow>(
      `WITH due AS (
         SELECT d.conversation_id, d.endpoint_url, d.seq
           FROM webhook_deliveries d
          WHERE d.status = 'pending' AND d.endpoint_url = ANY ($1::text[])
            ${conversationIds ? 'AND d.conversation_id = ANY ($6::uuid[])' : ''}
            AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= $2::timestamptz)
            AND (d.claimed_until IS NULL OR d.claimed_until <= $2::timestamptz)
            AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries earlier
               WHERE earlier.status = 'pending' AND earlier.conversation_id = d.conversation_id
                 AND earlier.endpoint_url = d.endpoint_url AND earlier.seq < d.seq)
          ORDER BY d.seq
          LIMIT $5
            FOR UPDATE OF d SKIP LOCKED
       )
       UPDATE webhook_deliveries d
          SET claim = $4::uuid, claimed_until = $3::timestamptz
         FROM due, ${RELAXED_COMMIT}
        WHERE d.conversation_id = due.conversation_id AND d.endpoint_url = due.endpoint_url
          AND d.seq = due.seq
       RETURNING ${COLUMNS}`,
      params,
    );
    return rows;
  }

  /**
   * The outcomes of many attempts in one statement. Delivered: whoever's
   * claim it is now, the endpoint has it. Failed: recorded only while the
   * attempt's claim still holds, pending again from `retry_at`, or failed for
   * good when it is null. Returns the rows it changed, with the status left.
   * Committed without waiting for the WAL to reach the disk (`RELAXED_COMMIT`).
   */
  async recordOutcomes(outcomes: readonly AttemptOutcomeRow[], at: Date): Promise<RecordedRow[]> {
    if (outcomes.length === 0) return [];
    const { rows } = await this.db.query<RecordedRow>(
      `UPDATE webhook_deliveries d
          SET attempts = d.attempts + 1,
              status = CASE WHEN o.delivered THEN 'delivered'
                            WHEN o.retry_at IS NULL THEN 'failed' ELSE 'pending' END,
              delivered_at = CASE WHEN o.delivered THEN $8::timestamptz END,
              next_attempt_at = CASE WHEN o.delivered THEN d.next_attempt_at ELSE o.retry_at END,
              last_error = o.error,
              claim = NULL, claimed_until = NULL
         FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::uuid[], $5::boolean[],
                     $6::text[], $7::timestamptz[])
              AS o(conversation_id, endpoint_url, seq, claim, delivered, error, retry_at),
              ${RELAXED_COMMIT}
        WHERE d.conversation_id = o.conversation_id AND d.endpoint_url = o.endpoint_url
          AND d.seq = o.seq AND d.status = 'pending' AND (o.delivered OR d.claim = o.claim)
       RETURNING d.conversation_id, d.endpoint_url, d.seq, d.status`,
      [
        outcomes.map((o) => o.conversation_id),
        outcomes.map((o) => o.endpoint_url),
        outcomes.map((o) => o.seq),
        outcomes.map((o) => o.claim),
        outcomes.map((o) => o.delivered),
        outcomes.map((o) => o.error),
        outcomes.map((o) => o.retry_at?.toISOString() ?? null),
        at.toISOString(),
      ],
    );
    return rows;
  }

  /** A tenant's deliveries, newest first, after the cursor's `seq`. */
  async listPage(
    tenantId: string,
    status: WebhookDeliveryStatus | null,
    beforeSeq: number | null,
    limit: number,
  ): Promise<WebhookDeliveryRow[]> {
    const { rows } = await this.db.query<WebhookDeliveryRow>(
      `SELECT ${COLUMNS}
         FROM webhook_deliveries d
        WHERE d.tenant_id = $1 AND ($2::text IS NULL OR d.status = $2::text)
          AND ($3::bigint IS NULL OR d.seq < $3::bigint)
        ORDER BY d.seq DESC
        LIMIT $4`,
      [tenantId, status, beforeSeq, limit],
    );
    return rows;
  }

  async find(tenantId: string, id: string): Promise<WebhookDeliveryRow | null> {
    const { rows } = await this.db.query<WebhookDeliveryRow>(
      `SELECT ${COLUMNS} FROM webhook_deliveries d WHERE d.id = $1::uuid AND d.tenant_id = $2`,
      [id, tenantId],
    );
    return rows[0] ?? null;
  }

  /** A failed delivery pending again, due at once, with its attempts counted afresh. */
  async requeueFailed(tenantId: string, id: string): Promise<WebhookDeliveryRow | null> {
    const { rows } = await this.db.query<WebhookDeliveryRow>(
      `UPDATE webhook_deliveries d
          SET status = 'pending', attempts = 0, next_attempt_at = NULL,
              claim = NULL, claimed_until = NULL
        WHERE d.id = $1::uuid AND d.tenant_id = $2 AND d.status = 'failed'
       RETURNING ${COLUMNS}`,
      [id, tenantId],
    );
    return rows[0] ?? null;
  }

  async countPending(): Promise<number> {
    const { rows } = await this.db.query<{ count: number }>(
      `SELECT count(*)::int AS count FROM webhook_deliveries WHERE status = 'pending'`,
    );
    return rows[0]?.count ?? 0;
  }
}
