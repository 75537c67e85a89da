/** SQL of the webhook outbox: `webhook_endpoints` and `webhook_deliveries` (migration 0009). */
import type { WebhookDeliveryStatus, WebhookEventType } from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';

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

export interface EndpointRow {
  url: string;
  events: string[] | null;
  tenants: string[] | null;
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
   * Claims the heads of the (conversation, endpoint) queues that are due:
   * the oldest pending delivery of each, when its retry time has come and no
   * live claim holds it. `FOR UPDATE … SKIP LOCKED` with the conditions
   * checked again on the locked row: two dispatchers never claim one delivery.
   */
  async claimDue(
    endpointUrls: readonly string[],
    now: Date,
    until: Date,
    claim: string,
    limit: number,
  ): Promise<WebhookDeliveryRow[]> {
    const { rows } = await this.db.query<WebhookDeliveryRow>(
      `WITH heads AS (
         SELECT DISTINCT ON (conversation_id, endpoint_url) conversation_id, endpoint_url, seq
           FROM webhook_deliveries
          WHERE status = 'pending'
          ORDER BY conversation_id, endpoint_url, seq
       ), due AS (
         SELECT d.conversation_id, d.endpoint_url, d.seq
           FROM heads h
           JOIN webhook_deliveries d
             ON d.conversation_id = h.conversation_id AND d.endpoint_url = h.endpoint_url
            AND d.seq = h.seq
          WHERE d.status = 'pending' AND d.endpoint_url = ANY ($1::text[])
            AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= $2::timestamptz)
            AND (d.claimed_until IS NULL OR d.claimed_until <= $2::timestamptz)
          ORDER BY d.next_attempt_at NULLS FIRST, d.seq
          LIMIT $5
            FOR UPDATE OF d SKIP LOCKED
       )
       UPDATE webhook_deliveries d
          SET claim = $4::uuid, claimed_until = $3::timestamptz
         FROM due
        WHERE d.conversation_id = due.conversation_id AND d.endpoint_url = due.endpoint_url
          AND d.seq = due.seq
       RETURNING ${COLUMNS}`,
      [endpointUrls, now.toISOString(), until.toISOString(), claim, limit],
    );
    return rows;
  }

  /** Delivered: whoever's claim it is now, the endpoint has it. */
  async markDelivered(row: WebhookDeliveryRow, at: Date): Promise<boolean> {
    const { rowCount } = await this.db.query(
      `UPDATE webhook_deliveries
          SET status = 'delivered', attempts = attempts + 1, delivered_at = $4::timestamptz,
              last_error = NULL, claim = NULL, claimed_until = NULL
        WHERE conversation_id = $1 AND endpoint_url = $2 AND seq = $3 AND status = 'pending'`,
      [row.conversation_id, row.endpoint_url, row.seq, at.toISOString()],
      PREPARED,
    );
    return rowCount > 0;
  }

  /**
   * A failed attempt, recorded only while `claim` still holds: pending again
   * from `retryAt`, or failed for good when it is null. Returns the status left.
   */
  async markAttemptFailed(
    row: WebhookDeliveryRow,
    claim: string,
    error: string,
    retryAt: Date | null,
  ): Promise<WebhookDeliveryStatus | null> {
    const { rows } = await this.db.query<{ status: WebhookDeliveryStatus }>(
      `UPDATE webhook_deliveries
          SET attempts = attempts + 1,
              status = CASE WHEN $6::timestamptz IS NULL THEN 'failed' ELSE 'pending' END,
              next_attempt_at = $6::timestamptz, last_error = $5,
              claim = NULL, claimed_until = NULL
        WHERE conversation_id = $1 AND endpoint_url = $2 AND seq = $3 AND claim = $4::uuid
          AND status = 'pending'
       RETURNING status`,
      [
        row.conversation_id,
        row.endpoint_url,
        row.seq,
        claim,
        error,
        retryAt?.toISOString() ?? null,
      ],
      PREPARED,
    );
    return rows[0]?.status ?? null;
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
