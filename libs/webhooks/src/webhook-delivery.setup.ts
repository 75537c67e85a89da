/** How a process that sends webhooks sets them up from its configuration. */
import type { AppConfig } from '@cs/config';
import type { WebhookOutbox } from '@cs/core';
import { WebhookDispatcher, type WebhookOutcome } from './webhook-dispatcher.js';

export interface WebhookDeliveryHooks {
  onOutcome?: (outcome: WebhookOutcome) => void;
  onError?: (message: string, error: unknown) => void;
  /** Overrides of the dispatcher's defaults (tests, the bench). */
  pollIntervalMs?: number;
  claimMarginMs?: number;
}

/**
 * Makes the configured endpoints the outbox's (every process of a
 * deployment does it at start, so that the triggers match messages against
 * them) and returns the dispatcher, not started.
 */
export async function setUpWebhookDelivery(
  outbox: WebhookOutbox,
  config: AppConfig['webhooks'],
  hooks: WebhookDeliveryHooks = {},
): Promise<WebhookDispatcher> {
  await outbox.syncEndpoints(
    config.endpoints.map((endpoint) => ({
      url: endpoint.url,
      ...(endpoint.events ? { events: endpoint.events } : {}),
      ...(endpoint.tenants ? { tenants: endpoint.tenants } : {}),
    })),
  );
  return new WebhookDispatcher(outbox, {
    endpoints: config.endpoints,
    timeoutMs: config.timeoutMs,
    maxAttempts: config.maxAttempts,
    ...hooks,
  });
}
