// Webhooks end to end on the standalone app (PGlite and Postgres): real
// receivers verify each request with the `standardwebhooks` library, see
// every message of a conversation in order (once, deduping by webhook-id)
// through failures, refused connections and redirects, and an admin reads
// and retries deliveries.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, devToken } from '../support/clients.js';
import { until } from '../support/cluster.js';
import { metricSample } from '../support/metrics.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import {
  startWebhookReceiver,
  type ReceivedWebhook,
  type WebhookReceiver,
} from '../support/webhook-receiver.js';
import { standaloneBackends } from '../support/standalone-backends.js';

const SECRET = 'e2e-webhooks-secret-0123456789abcdef';

const backends = standaloneBackends('cs-webhooks-e2e');

/** What a receiver got for one conversation, deduped, as (type, data) in arrival order. */
function story(receiver: WebhookReceiver, conversationId: string) {
  return receiver
    .deduped()
    .filter((webhook) => webhook.body.data.conversation_id === conversationId)
    .map((webhook) => ({ type: webhook.body.type, data: webhook.body.data }));
}

const typesOf = (webhooks: { type: string }[]) => webhooks.map((webhook) => webhook.type);

describe.each(backends)('webhooks on the standalone app ($name)', (backend) => {
  let app: AppProcess;
  let cleanup: () => Promise<void>;
  let steady: WebhookReceiver;
  let flaky: WebhookReceiver;
  let moved: WebhookReceiver;
  let tenant: string;
  let user: string;
  let admin: string;

  beforeAll(async () => {
    steady = await startWebhookReceiver({ seed: 'steady' });
    flaky = await startWebhookReceiver({ seed: 'flaky' });
    moved = await startWebhookReceiver({ seed: 'moved' });
    tenant = uniqueName('tenant');
    const prepared = await backend.env();
    cleanup = prepared.cleanup;
    app = await startApp('standalone', {
      ...prepared.env,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      WEBHOOK_MAX_ATTEMPTS: '2',
      WEBHOOK_TIMEOUT_MS: '2000',
      WEBHOOKS: JSON.stringify([
        { url: steady.url, secret: steady.secret },
        { url: flaky.url, secret: flaky.secret, tenants: [tenant] },
        { url: moved.url, secret: moved.secret, events: ['conversation.deleted'] },
      ]),
    });
    user = await devToken(app.url, { user_id: 'alice', tenant_id: tenant });
    admin = await devToken(app.url, { user_id: 'boss', tenant_id: tenant, roles: ['admin'] });
  }, 120_000);

  afterAll(async () => {
    await app?.stop();
    await cleanup?.();
    await Promise.all([steady, flaky, moved].map((receiver) => receiver?.close()));
  });

  it('tells every step of a conversation, signed, in order, once per webhook-id, through failures', async () => {
    // The flaky endpoint answers 500 to its first request, then refuses connections for a while.
    let failures = 1;
    flaky.answer = () => (failures-- > 0 ? 500 : 204);
    moved.answer = () => 302;

    const created = await api(app.url, 'POST', '/api/conversations', {
      token: user,
      body: { initial_user_msg: 'hello hooks' },
    });
    expect(created.status).toBe(201);
    const id: string = created.body.conversation_id;
    const completed = () =>
      story(steady, id).filter((webhook) => webhook.type === 'turn.completed');
    await until(() => completed().length === 1, 'the first turn.completed', 15_000);
    // The answer it names is the stored one.
    const answerId = Number(completed()[0]!.data.answer_event_id);
    const stored = await api(
      app.url,
      'GET',
      `/api/conversations/${id}/events?start_id=${answerId}&end_id=${answerId}`,
      { token: user },
    );
    expect(stored.body.events[0]).toMatchObject({
      source: 'agent',
      action: 'message',
      cause: 0,
      args: { content: completed()[0]!.data.content },
    });

    // The 500 was answered by a retry with the same webhook-id; then the endpoint goes down.
    await until(
      () =>
        flaky.received.filter((webhook) => webhook.body.data.conversation_id === id).length >= 2,
      'the flaky endpoint to get the retry',
      15_000,
    );
    await flaky.down();
    const sent = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
      token: user,
      body: { action: 'message', args: { content: 'second' } },
    });
    expect(sent.status).toBe(201);
    await until(() => completed().length === 2, 'the second turn.completed', 15_000);
    await flaky.up();
    expect((await api(app.url, 'DELETE', `/api/conversations/${id}`, { token: user })).status).toBe(
      204,
    );
    await until(
      () => typesOf(story(steady, id)).includes('conversation.deleted'),
      'conversation.deleted',
      15_000,
    );

    const told = story(steady, id);
    expect(typesOf(told)[0]).toBe('conversation.created');
    expect(typesOf(told).at(-1)).toBe('conversation.deleted');
    expect(typesOf(told).filter((type) => type === 'turn.completed')).toHaveLength(2);
    expect(told[0]!.data).toMatchObject({
      tenant_id: tenant,
      user_id: 'alice',
      conversation_id: id,
    });
    const first = completed()[0]!;
    expect(first.data).toMatchObject({
      tenant_id: tenant,
      user_id: 'alice',
      conversation_id: id,
      event_id: 0,
      usage: { prompt_tokens: 0, completion_tokens: 0, cost_usd: 0 },
    });
    expect(first.data.content).toContain('hello hooks');
    const statuses = told.filter((webhook) => webhook.type === 'conversation.status_changed');
    expect(statuses.length).toBeGreaterThan(0);
    for (const change of statuses) {
      expect(change.data.previous_status).not.toBe(change.data.status);
    }
    const stamp = (steady.deduped()[0] as ReceivedWebhook).body.timestamp;
    expect(new Date(stamp).toISOString()).toBe(stamp);

    // The flaky endpoint got the same story in the same order, each message
    // once after deduping, though some came twice (a 500, then a refusal).
    await until(
      () => story(flaky, id).length === told.length,
      () => `the flaky endpoint's story: ${JSON.stringify(typesOf(story(flaky, id)))}`,
      15_000,
    );
    expect(story(flaky, id)).toEqual(told);
    expect(flaky.received.length).toBeGreaterThan(flaky.deduped().length);
    expect(steady.rejected + flaky.rejected).toBe(0);
  }, 60_000);

  it('never follows a redirect: the delivery fails, and an admin sends it again', async () => {
    await until(
      async () => {
        const page = await api(app.url, 'GET', '/api/webhook-deliveries?status=failed', {
          token: admin,
        });
        return page.body.results?.some(
          (delivery: { endpoint_url: string }) => delivery.endpoint_url === moved.url,
        );
      },
      'the redirected delivery to fail',
      15_000,
    );
    // Two attempts reached the endpoint, none its redirect target.
    expect(moved.received.length).toBe(2);
    expect(moved.rejected).toBe(0);
    const failedPage = await api(app.url, 'GET', '/api/webhook-deliveries?status=failed', {
      token: admin,
    });
    const failed = failedPage.body.results.find(
      (delivery: { endpoint_url: string }) => delivery.endpoint_url === moved.url,
    );
    expect(failed).toMatchObject({
      type: 'conversation.deleted',
      status: 'failed',
      attempts: 2,
      delivered_at: null,
    });
    expect(failed.last_error).toMatch(/HTTP 302.*redirect/);
    expect(JSON.stringify(failedPage.body)).not.toContain(moved.secret.slice(6));

    // Only an admin sees the routes.
    expect((await api(app.url, 'GET', '/api/webhook-deliveries', { token: user })).status).toBe(
      404,
    );
    expect(
      (await api(app.url, 'POST', `/api/webhook-deliveries/${failed.id}/retry`, { token: user }))
        .status,
    ).toBe(404);
    const badStatus = await api(app.url, 'GET', '/api/webhook-deliveries?status=lost', {
      token: admin,
    });
    expect(badStatus.status).toBe(400);
    expect(badStatus.body.error).toMatchObject({ code: 'BAD_REQUEST', field: 'status' });
    const other = await devToken(app.url, {
      user_id: 'boss',
      tenant_id: uniqueName('other'),
      roles: ['admin'],
    });
    const otherPage = await api(app.url, 'GET', '/api/webhook-deliveries', { token: other });
    expect(otherPage.body).toEqual({ results: [], next_page_id: null });
    expect(
      (await api(app.url, 'POST', `/api/webhook-deliveries/${failed.id}/retry`, { token: other }))
        .status,
    ).toBe(404);

    const page = await api(app.url, 'GET', '/api/webhook-deliveries?limit=2', { token: admin });
    expect(page.body.results).toHaveLength(2);
    const next = await api(
      app.url,
      'GET',
      `/api/webhook-deliveries?limit=2&page_id=${page.body.next_page_id}`,
      { token: admin },
    );
    expect(next.body.results[0].id).not.toBe(page.body.results[1].id);

    moved.answer = () => 200;
    const retried = await api(app.url, 'POST', `/api/webhook-deliveries/${failed.id}/retry`, {
      token: admin,
    });
    expect(retried.status).toBe(200);
    expect(retried.body).toMatchObject({ id: failed.id, status: 'pending', attempts: 0 });
    await until(() => moved.received.length === 3, 'the retried delivery', 10_000);
    expect(moved.received.map((webhook) => webhook.id)).toEqual([failed.id, failed.id, failed.id]);
    await until(
      async () =>
        (
          await api(app.url, 'GET', '/api/webhook-deliveries?status=delivered&limit=100', {
            token: admin,
          })
        ).body.results.some((delivery: { id: string }) => delivery.id === failed.id),
      'the retried delivery to be delivered',
    );
    const again = await api(app.url, 'POST', `/api/webhook-deliveries/${failed.id}/retry`, {
      token: admin,
    });
    expect(again.status).toBe(409);

    const metrics = await (await fetch(`${app.url}/metrics`)).text();
    expect(metricSample(metrics, 'cs_webhook_deliveries_total')).toBeGreaterThan(5);
    expect(metrics).toMatch(/cs_webhook_deliveries_total\{[^}]*outcome="retried"[^}]*\} [1-9]/);
    expect(metrics).toMatch(/cs_webhook_deliveries_total\{[^}]*outcome="failed"[^}]*\} [1-9]/);
    expect(metricSample(metrics, 'cs_webhook_pending')).toBe(0);
  }, 60_000);
});

describe('webhook configuration', () => {
  it('refuses to start with bad endpoints, with one line naming the problem', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cs-webhooks-'));
    try {
      for (const [value, problem] of [
        ['[{', /^ {2}- WEBHOOKS: must be JSON/m],
        [
          JSON.stringify([{ url: 'ftp://x/y', secret: 'whsec_MDEyMzQ1Njc4OWFiY2RlZg==' }]),
          /WEBHOOKS: 0\.url/,
        ],
        [
          JSON.stringify([{ url: 'https://x/y', secret: 'not-a-secret-at-all' }]),
          /WEBHOOKS: 0\.secret/,
        ],
      ] as const) {
        const started = startApp(
          'standalone',
          { DATA_DIR: dir, WEBHOOKS: value },
          { timeoutMs: 20_000 },
        );
        await expect(started).rejects.toThrow(problem);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
