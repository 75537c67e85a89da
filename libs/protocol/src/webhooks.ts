/** What webhooks tell product backends (PROTOCOL.md "Webhooks"). */

/** The types of webhook messages, in the order PROTOCOL.md lists them. */
export const WEBHOOK_EVENT_TYPES = [
  'conversation.created',
  'conversation.deleted',
  'conversation.status_changed',
  'turn.completed',
  'turn.failed',
  'approval.requested',
] as const;
export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

/** Where a delivery stands. */
export const WEBHOOK_DELIVERY_STATUSES = ['pending', 'delivered', 'failed'] as const;
export type WebhookDeliveryStatus = (typeof WEBHOOK_DELIVERY_STATUSES)[number];

/** The body of every webhook request. */
export interface WebhookBody {
  type: WebhookEventType;
  /** When what it tells happened (ISO 8601, UTC). */
  timestamp: string;
  data: { tenant_id: string; user_id: string; conversation_id: string } & Record<string, unknown>;
}

/** A delivery as `GET /api/webhook-deliveries` lists it. */
export interface WebhookDeliveryInfo {
  id: string;
  type: WebhookEventType;
  conversation_id: string;
  endpoint_url: string;
  status: WebhookDeliveryStatus;
  attempts: number;
  last_error: string | null;
  created_at: string;
  delivered_at: string | null;
}
