import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { WebhookDelivery } from '@cs/core';
import { Webhook } from 'standardwebhooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { retryDelayMs } from './webhook-backoff.js';
import { MAX_WEBHOOK_BODY_BYTES, postWebhook, webhookBody } from './webhook-request.js';

const SECRET = `whsec_${Buffer.from('a key of twenty-four byt').toString('base64')}`;

function delivery(data: Record<string, unknown>, url = 'http://127.0.0.1:1/x'): WebhookDelivery {
  return {
    id: '7d0f6a7e-2b55-4c1e-9d6e-0a8f3c1b2d4e',
    conversationId: '0b9f4d8e-8a3c-4b8e-9f65-2d1c3b4a5e6f',
    endpointUrl: url,
    seq: 1,
    tenantId: 't',
    userId: 'u',
    type: 'turn.completed',
    occurredAt: new Date('2026-12-06T10:00:00.123Z'),
    data,
    status: 'pending',
    attempts: 0,
    lastError: null,
    createdAt: new Date(),
    deliveredAt: null,
  };
}

describe(retryDelayMs.name, () => {
  it('starts at 1 s, doubles, stops at 1 h, and jitters below each value', () => {
    expect(retryDelayMs(1, () => 1)).toBe(1_000);
    expect(retryDelayMs(2, () => 1)).toBe(2_000);
    expect(retryDelayMs(5, () => 1)).toBe(16_000);
    expect(retryDelayMs(13, () => 1)).toBe(3_600_000);
    expect(retryDelayMs(40, () => 1)).toBe(3_600_000);
    expect(retryDelayMs(2, () => 0)).toBe(1_500);
  });
});

describe(webhookBody.name, () => {
  it('puts the ids first in data, and the occurrence time as the timestamp', () => {
    expect(JSON.parse(webhookBody(delivery({ event_id: 3 })))).toEqual({
      type: 'turn.completed',
      timestamp: '2026-12-06T10:00:00.123Z',
      data: {
        tenant_id: 't',
        user_id: 'u',
        conversation_id: '0b9f4d8e-8a3c-4b8e-9f65-2d1c3b4a5e6f',
        event_id: 3,
      },
    });
  });

  it('cuts a long answer to fit 256 KiB, the same way every time', () => {
    const content = 'é'.repeat(300_000);
    const body = webhookBody(delivery({ content }));
    expect(Buffer.byteLength(body)).toBeLessThanOrEqual(MAX_WEBHOOK_BODY_BYTES);
    expect(Buffer.byteLength(body)).toBeGreaterThan(MAX_WEBHOOK_BODY_BYTES - 8);
    const parsed = JSON.parse(body);
    expect(parsed.data.content_truncated).toBe(true);
    expect(content.startsWith(parsed.data.content)).toBe(true);
    expect(webhookBody(delivery({ content }))).toBe(body);
  });
});

describe(postWebhook.name, () => {
  let url = '';
  let answer = 204;
  const seen: { headers: Record<string, string>; body: string }[] = [];
  const server = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk: Buffer) => (body += chunk.toString()));
    request.on('end', () => {
      seen.push({ headers: request.headers as Record<string, string>, body });
      if (answer === 0) return; // never answers
      response.writeHead(answer, { location: `${url}/elsewhere` }).end();
    });
  });

  beforeAll(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`;
  });
  afterAll(() => {
    server.closeAllConnections();
    server.close();
  });

  it('signs so that the Standard Webhooks library verifies it', async () => {
    answer = 204;
    expect(await postWebhook(delivery({ a: 1 }, url), SECRET, 2_000)).toEqual({ ok: true });
    const [request] = seen.splice(0);
    const verified = new Webhook(SECRET).verify(request!.body, {
      'webhook-id': request!.headers['webhook-id']!,
      'webhook-timestamp': request!.headers['webhook-timestamp']!,
      'webhook-signature': request!.headers['webhook-signature']!,
    });
    expect(verified).toMatchObject({ type: 'turn.completed', data: { a: 1 } });
    expect(request!.headers['webhook-id']).toBe(delivery({}).id);
  });

  it('counts a redirect, an error status, a timeout and a refusal as failures, without the secret', async () => {
    answer = 302;
    const redirected = await postWebhook(delivery({}, url), SECRET, 2_000);
    expect(redirected).toEqual({ ok: false, error: 'HTTP 302 (redirects are not followed)' });
    expect(seen.splice(0).length).toBe(1);
    answer = 503;
    expect(await postWebhook(delivery({}, url), SECRET, 2_000)).toEqual({
      ok: false,
      error: 'HTTP 503',
    });
    answer = 0;
    expect(await postWebhook(delivery({}, url), SECRET, 100)).toEqual({
      ok: false,
      error: 'no answer within 100 ms',
    });
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const refused = await postWebhook(delivery({}, `http://127.0.0.1:${port}/x`), SECRET, 2_000);
    expect(refused).toEqual({ ok: false, error: 'request failed (ECONNREFUSED)' });
    expect(JSON.stringify(refused)).not.toContain(SECRET.slice(6));
  });
});
