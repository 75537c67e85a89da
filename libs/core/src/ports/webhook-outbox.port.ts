import type { WebhookDeliveryStatus, WebhookEventType } from '@cs/protocol';

/** An endpoint as the outbox matches messages to it (its secret stays with the dispatcher). */
export interface WebhookEndpointRoute {
  url: string;
  /** Undefined: every type. */
  events?: readonly WebhookEventType[];
  /** Undefined: every tenant. */
  tenants?: readonly string[];
}

/** One message to one endpoint, as stored. */
export interface WebhookDelivery {
  /** The `webhook-id`, the same on every attempt. */
  id: string;
  conversationId: string;
  endpointUrl: string;
  /** Its place among the deliveries of its (conversation, endpoint). */
  seq: number;
  tenantId: string;
  userId: string;
  type: WebhookEventType;
  /** When what it tells happened: the body's `timestamp`. */
  occurredAt: Date;
  /** The body's `data` besides tenant_id, user_id and conversation_id. */
  data: Record<string, unknown>;
  status: WebhookDeliveryStatus;
  attempts: number;
  lastError: string | null;
  createdAt: Date;
  deliveredAt: Date | null;
}

/** A delivery handed to one dispatcher for one attempt. */
export interface ClaimedWebhookDelivery extends WebhookDelivery {
  /** The claim's token: an outcome is recorded only while it still holds. */
  claim: string;
}

export interface WebhookClaimRequest {
  /** Only deliveries to these endpoints (the ones this process can sign for). */
  endpointUrls: readonly string[];
  limit: number;
  /** The claim lasts this long: past it (the process died), another takes the delivery over. */
  claimMs: number;
  /**
   * Only deliveries of these conversations (those this process has just
   * written to): found through their queues' index, whatever the outbox holds
   * besides. Absent: every conversation's, oldest first.
   */
  conversationIds?: readonly string[];
}

/** What an attempt came to. */
export type WebhookAttemptOutcome =
  | { delivered: true }
  | {
      delivered: false;
      /** Why, safe to show to an admin (no secret). */
      error: string;
      /** When to try again; null: never (the attempts are spent). */
      retryAt: Date | null;
    };

/** One attempt's outcome, to be recorded with others in one write. */
export interface WebhookAttemptRecord {
  delivery: ClaimedWebhookDelivery;
  outcome: WebhookAttemptOutcome;
}

export interface WebhookDeliveryPageRequest {
  tenantId: string;
  status?: WebhookDeliveryStatus;
  limit: number;
  /** Opaque cursor from a previous page's `nextCursor`. */
  cursor?: string;
}

/**
 * The transactional outbox of webhook deliveries (docs/protocol.md "Webhooks").
 * Deliveries are written by the store itself, in the transaction of what
 * causes them; this port hands them out in order per (conversation,
 * endpoint), records outcomes and serves the admin routes.
 */
export interface WebhookOutbox {
  /** Makes the configured endpoints the ones new messages go to. */
  syncEndpoints(endpoints: readonly WebhookEndpointRoute[]): Promise<void>;
  /**
   * Claims due deliveries, at most one per (conversation, endpoint): the
   * oldest pending one, once its retry time has come and no live claim holds it.
   */
  claimDue(request: WebhookClaimRequest): Promise<ClaimedWebhookDelivery[]>;
  /**
   * Records attempts, all in one write (a dispatcher sends many at once);
   * returns the status each left, in their order: null where nothing was
   * recorded (a failure whose claim no longer held, a delivery no longer
   * pending). A delivery is recorded as delivered whoever holds it now.
   */
  recordAttempts(
    records: readonly WebhookAttemptRecord[],
  ): Promise<(WebhookDeliveryStatus | null)[]>;
  listDeliveries(
    request: WebhookDeliveryPageRequest,
  ): Promise<{ items: WebhookDelivery[]; nextCursor: string | null }>;
  /**
   * Makes a failed delivery of the tenant pending again with fresh attempts.
   * `not_found` for an unknown id (or another tenant's), `not_failed` when it is not failed.
   */
  retryDelivery(
    tenantId: string,
    id: string,
  ): Promise<WebhookDelivery | 'not_found' | 'not_failed'>;
  /** Deliveries not yet delivered nor failed. */
  countPending(): Promise<number>;
}
