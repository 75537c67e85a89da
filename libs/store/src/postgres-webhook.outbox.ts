/**
 * The `WebhookOutbox` on Postgres or PGlite. Deliveries are written by the
 * triggers of migration 0009 in the transaction of what causes them; this
 * class hands them out, records outcomes and serves the admin routes.
 */
import { randomUUID } from 'node:crypto';
import type {
  ClaimedWebhookDelivery,
  WebhookAttemptRecord,
  WebhookClaimRequest,
  WebhookDelivery,
  WebhookDeliveryPageRequest,
  WebhookEndpointRoute,
  WebhookOutbox,
} from '@cs/core';
import { BadRequestError } from '@cs/core';
import type { WebhookDeliveryStatus } from '@cs/protocol';
import { isUuid } from './conversation-page.cursor.js';
import type { SqlDatabase } from './database/sql-database.js';
import type { WebhookDeliveryRow } from './repositories/webhook-delivery.repository.js';
import { WebhookDeliveryRepository } from './repositories/webhook-delivery.repository.js';

/** A page cursor: the last row's seq, as base64url of its decimal digits. */
const SEQ = /^[1-9]\d{0,15}$/;

export class PostgresWebhookOutbox implements WebhookOutbox {
  private readonly deliveries: WebhookDeliveryRepository;

  constructor(
    private readonly database: SqlDatabase,
    private readonly now: () => Date = () => new Date(),
  ) {
    this.deliveries = new WebhookDeliveryRepository(database);
  }

  /** In one transaction: a message is matched against the old list or the new, never half of each. */
  async syncEndpoints(endpoints: readonly WebhookEndpointRoute[]): Promise<void> {
    const wanted = endpoints.map((endpoint) => ({
      url: endpoint.url,
      events: endpoint.events ? [...endpoint.events] : null,
      tenants: endpoint.tenants ? [...endpoint.tenants] : null,
    }));
    const current = await this.deliveries.listEndpoints();
    const same =
      current.length === wanted.length &&
      wanted.every((endpoint) =>
        current.some(
          (row) =>
            row.url === endpoint.url &&
            JSON.stringify(row.events) === JSON.stringify(endpoint.events) &&
            JSON.stringify(row.tenants) === JSON.stringify(endpoint.tenants),
        ),
      );
    // Processes of a deployment starting at once find it done: no write, no lock.
    if (same) return;
    await this.database.transaction(async (tx) => {
      const repository = new WebhookDeliveryRepository(tx);
      await repository.deleteEndpointsExcept(wanted.map((endpoint) => endpoint.url));
      for (const endpoint of wanted) await repository.upsertEndpoint(endpoint);
    });
  }

  async claimDue(request: WebhookClaimRequest): Promise<ClaimedWebhookDelivery[]> {
    if (request.endpointUrls.length === 0 || request.limit < 1) return [];
    const conversationIds = request.conversationIds?.filter(isUuid) ?? null;
    if (conversationIds?.length === 0) return [];
    const now = this.now();
    const claim = randomUUID();
    const rows = await this.deliveries.claimDue(
      request.endpointUrls,
      now,
      new Date(now.getTime() + request.claimMs),
      claim,
      request.limit,
      conversationIds,
    );
    return rows.map((row) => ({ ...toDelivery(row), claim }));
  }

  async recordAttempts(
    records: readonly WebhookAttemptRecord[],
  ): Promise<(WebhookDeliveryStatus | null)[]> {
    const recorded = await this.deliveries.recordOutcomes(
      records.map(({ delivery, outcome }) => ({
        conversation_id: delivery.conversationId,
        endpoint_url: delivery.endpointUrl,
        seq: delivery.seq,
        claim: delivery.claim,
        delivered: outcome.delivered,
        error: outcome.delivered ? null : outcome.error,
        retry_at: outcome.delivered ? null : outcome.retryAt,
      })),
      this.now(),
    );
    const statuses = new Map(
      recorded.map((row) => [
        deliveryKey(row.conversation_id, row.endpoint_url, row.seq),
        row.status,
      ]),
    );
    return records.map(
      ({ delivery }) =>
        statuses.get(deliveryKey(delivery.conversationId, delivery.endpointUrl, delivery.seq)) ??
        null,
    );
  }

  async listDeliveries(
    request: WebhookDeliveryPageRequest,
  ): Promise<{ items: WebhookDelivery[]; nextCursor: string | null }> {
    if (!Number.isSafeInteger(request.limit) || request.limit < 1) {
      throw new BadRequestError('limit must be a positive integer', 'limit');
    }
    const before = request.cursor === undefined ? null : decodeSeqCursor(request.cursor);
    const rows = await this.deliveries.listPage(
      request.tenantId,
      request.status ?? null,
      before,
      request.limit + 1,
    );
    const items = rows.slice(0, request.limit);
    const last = items[items.length - 1];
    return {
      items: items.map(toDelivery),
      nextCursor:
        rows.length > request.limit && last
          ? Buffer.from(String(last.seq)).toString('base64url')
          : null,
    };
  }

  async retryDelivery(
    tenantId: string,
    id: string,
  ): Promise<WebhookDelivery | 'not_found' | 'not_failed'> {
    if (!isUuid(id)) return 'not_found';
    const requeued = await this.deliveries.requeueFailed(tenantId, id.toLowerCase());
    if (requeued) return toDelivery(requeued);
    return (await this.deliveries.find(tenantId, id.toLowerCase())) ? 'not_failed' : 'not_found';
  }

  countPending(): Promise<number> {
    return this.deliveries.countPending();
  }
}

function deliveryKey(conversationId: string, endpointUrl: string, seq: number): string {
  return `${conversationId} ${seq} ${endpointUrl}`;
}

function decodeSeqCursor(cursor: string): number {
  const text = Buffer.from(cursor, 'base64url').toString('utf8');
  if (!SEQ.test(text) || Buffer.from(text).toString('base64url') !== cursor) {
    throw new BadRequestError('invalid page_id', 'page_id');
  }
  return Number(text);
}

function toDelivery(row: WebhookDeliveryRow): WebhookDelivery {
  return {
    id: row.id,
    conversationId: row.conversation_id,
    endpointUrl: row.endpoint_url,
    seq: row.seq,
    tenantId: row.tenant_id,
    userId: row.user_id,
    type: row.type,
    occurredAt: row.occurred_at,
    data: row.data,
    status: row.status,
    attempts: row.attempts,
    lastError: row.last_error,
    createdAt: row.created_at,
    deliveredAt: row.delivered_at,
  };
}
