/**
 * One attempt of one delivery: the body, signed as Standard Webhooks says
 * (with its own library, `standardwebhooks`), posted once, redirects not
 * followed, bounded by the timeout. What it reports never holds the secret.
 */
import type { WebhookDelivery } from '@cs/core';
import type { WebhookBody } from '@cs/protocol';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { Webhook } from 'standardwebhooks';

/** The largest body sent; a longer answer's `content` is cut to fit. */
export const MAX_WEBHOOK_BODY_BYTES = 256 * 1024;

/**
 * The body of a delivery, the same on every attempt. An answer too long for
 * `MAX_WEBHOOK_BODY_BYTES` keeps the longest prefix of its `content` that
 * fits, with `content_truncated: true`.
 */
export function webhookBody(delivery: WebhookDelivery): string {
  const body: WebhookBody = {
    type: delivery.type,
    timestamp: delivery.occurredAt.toISOString(),
    data: {
      tenant_id: delivery.tenantId,
      user_id: delivery.userId,
      conversation_id: delivery.conversationId,
      ...delivery.data,
    },
  };
  const text = JSON.stringify(body);
  const content = body.data.content;
  if (Buffer.byteLength(text) <= MAX_WEBHOOK_BODY_BYTES || typeof content !== 'string') {
    return text;
  }
  const cut = (length: number) =>
    JSON.stringify({
      ...body,
      data: { ...body.data, content: content.slice(0, length), content_truncated: true },
    });
  let fits = 0;
  let over = content.length;
  while (over - fits > 1) {
    const middle = Math.floor((fits + over) / 2);
    if (Buffer.byteLength(cut(middle)) <= MAX_WEBHOOK_BODY_BYTES) fits = middle;
    else over = middle;
  }
  return cut(fits);
}

export type WebhookAttemptResult = { ok: true } | { ok: false; error: string };

/** Posts the delivery once to its endpoint, signed with `secret`. */
export async function postWebhook(
  delivery: WebhookDelivery,
  secret: string,
  timeoutMs: number,
): Promise<WebhookAttemptResult> {
  const body = webhookBody(delivery);
  const signedAt = new Date();
  const headers = {
    'content-type': 'application/json',
    'content-length': String(Buffer.byteLength(body)),
    'user-agent': 'conversation-service-webhooks',
    'webhook-id': delivery.id,
    'webhook-timestamp': String(Math.floor(signedAt.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(delivery.id, signedAt, body),
  };
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const status = await post(delivery.endpointUrl, headers, body, signal);
    if (status >= 200 && status < 300) return { ok: true };
    if (status >= 300 && status < 400) {
      return { ok: false, error: `HTTP ${status} (redirects are not followed)` };
    }
    return { ok: false, error: `HTTP ${status}` };
  } catch (error) {
    if (signal.aborted) return { ok: false, error: `no answer within ${timeoutMs} ms` };
    return { ok: false, error: `request failed (${failureCode(error)})` };
  }
}

/**
 * The status of the answer to one POST. `node:http` rather than `fetch`: it
 * never follows a redirect, and it costs a sender a fraction of fetch's CPU
 * (no web streams or Response around each attempt), connections being kept
 * alive by the global agents all the same.
 */
function post(
  url: string,
  headers: Record<string, string>,
  body: string,
  signal: AbortSignal,
): Promise<number> {
  const target = new URL(url);
  const send = target.protocol === 'https:' ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const request = send(target, { method: 'POST', headers, signal }, (response) => {
      // What the endpoint answers is not read, only its status: drained so
      // that the connection serves the next attempt (the signal still bounds it).
      response.on('error', () => undefined);
      response.resume();
      resolve(response.statusCode ?? 0);
    });
    request.on('error', reject);
    request.end(body);
  });
}

/**
 * The system error code of a failed request (ECONNREFUSED, ENOTFOUND, …),
 * or the error's name; never the request's headers.
 */
function failureCode(error: unknown): string {
  if (typeof error === 'object' && error !== null && 'code' in error) {
    const code = (error as { code?: unknown }).code;
    if (typeof code === 'string') return code;
  }
  return error instanceof Error ? error.name : 'unknown error';
}
