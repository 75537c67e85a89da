/** What webhooks tell product backends (docs/protocol.md "Webhooks"). */
import { z } from 'zod';
import { DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT } from './limits.js';
import { queryInt } from './rest.js';

/** The types of webhook messages, in the order docs/protocol.md lists them. */
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

/** `GET /api/webhook-deliveries` query. */
export const ListWebhookDeliveriesQuerySchema = z.strictObject({
  status: z.enum(WEBHOOK_DELIVERY_STATUSES).optional(),
  limit: queryInt(1, MAX_PAGE_LIMIT).default(DEFAULT_PAGE_LIMIT),
  /** The opaque cursor of the previous page; the outbox decodes and checks it. */
  page_id: z
    .string()
    .min(1)
    .max(64)
    .regex(/^[A-Za-z0-9_-]+$/, 'must be a page id')
    .optional(),
});
export type ListWebhookDeliveriesQuery = z.infer<typeof ListWebhookDeliveriesQuerySchema>;

export interface WebhookDeliveryPage {
  results: WebhookDeliveryInfo[];
  next_page_id: string | null;
}
