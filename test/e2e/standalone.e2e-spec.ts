// The standalone service end to end, as a client sees it: the built app in its
// own process, a Socket.IO client and HTTP, on PGlite and on Postgres.
import { rmSync } from 'node:fs';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_MESSAGE_CONTENT_CHARS, type StatusUpdate, type StoredEvent } from '@cs/protocol';
import { ConversationClient, api, devToken, ids, isAgentReply } from '../support/clients.js';
import { REFUSAL_ENV, refusalStoresNothing } from '../support/concurrency-refusal.js';
import { metricGrowth, metricTotals } from '../support/metrics.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';
import { standaloneBackends } from '../support/standalone-backends.js';

const SECRET = 'e2e-secret-0123456789abcdef-0123456789';

const backends = standaloneBackends('cs-e2e');

async function sign(
  claims: Record<string, unknown>,
  expiresIn: string | number = '1h',
): Promise<string> {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: 'HS256' })
    .setIssuedAt()
    .setExpirationTime(expiresIn)
    .sign(new TextEncoder().encode(SECRET));
}

async function createConversation(
  app: AppProcess,
  token: string,
  body: Record<string, unknown> = {},
) {
  const response = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
    token,
    body,
  });
  expect(response.status).toBe(201);
  return response.body.conversation_id;
}

async function eventsOf(app: AppProcess, token: string, id: string): Promise<StoredEvent[]> {
  const all: StoredEvent[] = [];
  for (;;) {
    const start = all.length;
    const page = await api<{ events: StoredEvent[]; has_more: boolean }>(
      app.url,
      'GET',
      `/api/conversations/${id}/events?start_id=${start}&limit=100`,
      { token },
    );
    expect(page.status).toBe(200);
    all.push(...page.body.events);
    if (!page.body.has_more) return all;
  }
}

async function until(
  check: () => Promise<boolean>,
  what: string,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe.each(backends)('standalone service on $name', (backend) => {
  let app: AppProcess;
  let env: Record<string, string>;
  let cleanup: () => Promise<void>;
  let token: string;
  const tenant = uniqueName('tenant');

  beforeAll(async () => {
    ({ env, cleanup } = await backend.env());
    env = {
      ...env,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      RATE_LIMIT_PER_MINUTE: '0',
      MAX_CONCURRENT_CONVERSATIONS: '2',
    };
    app = await startApp('standalone', env);
    token = await devToken(app.url, { user_id: 'alice', tenant_id: tenant });
  });

  afterAll(async () => {
    await app?.stop();
    await cleanup?.();
  });

  it('answers a message with the echo, every event once and in order', async () => {
    const id = await createConversation(app, token, { title: 'hello' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    try {
      await client.waitFor(
        (events) =>
          events.some((e) => 'observation' in e && e.extras.agent_state === 'awaiting_user_input'),
        10_000,
        'agent ready',
      );
      const ack = await client.message('hi there');
      expect(ack.ok).toBe(true);
      const eventId = ack.ok ? ack.event_id : -1;
      await client.waitForReply(eventId);
      const reply = client.stored.find((e) => isAgentReply(e, eventId));
      expect(reply && 'args' in reply ? String(reply.args.content) : '').toContain('hi there');
      const received = ids(client.events);
      expect(received).toEqual(received.map((_, index) => index));
    } finally {
      client.close();
    }
  });

  it('answers the longest message a user may send (262,144 characters) with its whole text, over the socket and over REST', async () => {
    const longest = (tail: string) => `${'語'.repeat(MAX_MESSAGE_CONTENT_CHARS - 2)}${tail}`;
    const id = await createConversation(app, token, { title: 'longest' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    try {
      const bySocket = longest('👋');
      const ack = await client.message(bySocket);
      expect(ack.ok).toBe(true);
      const socketId = ack.ok ? ack.event_id : -1;
      await client.waitForReply(socketId, 30_000);
      const reply = client.stored.find((e) => isAgentReply(e, socketId));
      expect(reply && 'args' in reply ? reply.args.content : null).toBe(`echo: ${bySocket}`);

      const byRest = longest('!?');
      const posted = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
        token,
        body: { action: 'message', args: { content: byRest } },
      });
      expect(posted.status).toBe(201);
      const restId = posted.body.event_id as number;
      await client.waitForReply(restId, 30_000);
      const page = await api(
        app.url,
        'GET',
        `/api/conversations/${id}/events?start_id=${restId}&limit=10`,
        { token },
      );
      const stored = (page.body.events as StoredEvent[]).find((e) => isAgentReply(e, restId));
      expect(stored && 'args' in stored ? stored.args.content : null).toBe(`echo: ${byRest}`);
    } finally {
      client.close();
    }
  });

  it('replays exactly the missed events to a client that reconnects with latest_event_id', async () => {
    const id = await createConversation(app, token);
    const first = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const ack = await first.message('one');
    await first.waitForReply(ack.ok ? ack.event_id : -1);
    const seen = Math.max(...ids(first.events));
    first.close();

    for (const text of ['two', 'three']) {
      const sent = await api<{ event_id: number }>(
        app.url,
        'POST',
        `/api/conversations/${id}/events`,
        {
          token,
          body: { action: 'message', args: { content: text } },
        },
      );
      expect(sent.status).toBe(201);
    }
    await until(
      async () => (await eventsOf(app, token, id)).filter((e) => e.source === 'agent').length >= 3,
      'answers',
    );
    const stored = await eventsOf(app, token, id);

    const again = await ConversationClient.connect(app.url, token, {
      conversation_id: id,
      latest_event_id: String(seen),
    });
    try {
      const last = stored[stored.length - 1]!.id;
      await again.waitFor((events) => ids(events).includes(last), 10_000, 'replay');
      expect(ids(again.events).filter((n) => n <= last)).toEqual(
        stored.filter((e) => e.id > seen).map((e) => e.id),
      );
    } finally {
      again.close();
    }
  });

  it('delivers each id once and in order when appends race with the replay', async () => {
    const id = await createConversation(app, token);
    const writer = await ConversationClient.connect(app.url, token, { conversation_id: id });
    // A long history makes the replay take a while.
    await Promise.all(Array.from({ length: 80 }, (_, n) => writer.message(`before ${n}`)));
    const racing = Array.from({ length: 30 }, (_, n) => writer.message(`during ${n}`));
    const reader = await ConversationClient.connect(app.url, token, {
      conversation_id: id,
      start: 'false',
    });
    try {
      const acks = await Promise.all(racing);
      expect(acks.every((a) => a.ok)).toBe(true);
      const lastUser = Math.max(...acks.map((a) => (a.ok ? a.event_id : -1)));
      await reader.waitFor(
        (events) => events.some((e) => isAgentReply(e, lastUser)),
        20_000,
        'last reply',
      );
      const received = ids(reader.events);
      expect(received).toEqual(received.map((_, index) => index));
    } finally {
      writer.close();
      reader.close();
    }
  });

  it('stores a repeated client_event_id once over the socket and over REST', async () => {
    const id = await createConversation(app, token);
    const client = await ConversationClient.connect(app.url, token, {
      conversation_id: id,
      start: 'false',
    });
    try {
      const first = await client.message('same', 'key-1');
      const second = await client.message('same', 'key-1');
      expect(first).toMatchObject({ ok: true });
      expect(second).toEqual(first);
      const conflict = await client.message('different', 'key-1');
      expect(conflict).toMatchObject({ ok: false, error: { code: 'CONFLICT' } });

      const path = `/api/conversations/${id}/events`;
      const body = { action: 'message', args: { content: 'rest' } };
      const created = await api(app.url, 'POST', path, {
        token,
        body,
        headers: { 'idempotency-key': 'key-2' },
      });
      const repeated = await api(app.url, 'POST', path, {
        token,
        body,
        headers: { 'idempotency-key': 'key-2' },
      });
      expect(created.status).toBe(201);
      expect(repeated.status).toBe(200);
      expect(repeated.body).toEqual(created.body);
      const other = await api(app.url, 'POST', path, {
        token,
        body: { action: 'message', args: { content: 'other' } },
        headers: { 'idempotency-key': 'key-2' },
      });
      expect(other.status).toBe(409);
      expect(other.body).toMatchObject({ error: { code: 'CONFLICT' } });
      // The socket and REST share one key space.
      const shared = await api(app.url, 'POST', path, {
        token,
        body: { action: 'message', args: { content: 'same' } },
        headers: { 'idempotency-key': 'key-1' },
      });
      expect(shared.status).toBe(200);
      expect(shared.body).toEqual({ event_id: first.ok ? first.event_id : -1 });

      const users = (await eventsOf(app, token, id)).filter((e) => e.source === 'user');
      expect(users.map((e) => ('args' in e ? e.args.content : null))).toEqual(['same', 'rest']);
    } finally {
      client.close();
    }
  });

  it('evicts the least recently active conversation at the per-user limit, with a notice', async () => {
    const user = await devToken(app.url, { user_id: uniqueName('limited'), tenant_id: tenant });
    const limitCounters = ['cs_limit_evictions_total', 'cs_limit_rejections_total'] as const;
    const countedBefore = await metricTotals([app.url], limitCounters);
    const [a, b, c] = [
      await createConversation(app, user),
      await createConversation(app, user),
      await createConversation(app, user),
    ];
    const clientA = await ConversationClient.connect(app.url, user, { conversation_id: a });
    await clientA.waitFor((events) =>
      events.some((e) => 'observation' in e && e.extras.agent_state === 'awaiting_user_input'),
    );
    const clientB = await ConversationClient.connect(app.url, user, { conversation_id: b });
    await clientB.waitFor((events) =>
      events.some((e) => 'observation' in e && e.extras.agent_state === 'awaiting_user_input'),
    );
    const clientC = await ConversationClient.connect(app.url, user, { conversation_id: c });
    try {
      await clientC.waitFor((events) =>
        events.some((e) => 'observation' in e && e.extras.agent_state === 'awaiting_user_input'),
      );
      await clientA.waitFor(
        (events) =>
          events.some((e) => 'status_update' in e && e.id === 'AGENT_ERROR$TOO_MANY_CONVERSATIONS'),
        10_000,
        'eviction notice',
      );
      await clientA.waitFor((events) =>
        events.some(
          (e) =>
            'observation' in e &&
            e.observation === 'agent_state_changed' &&
            e.extras.agent_state === 'stopped' &&
            e.extras.reason === 'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
        ),
      );
      const notice = clientA.events.find((e) => 'status_update' in e) as StatusUpdate;
      expect(notice.type).toBe('error');
      expect(clientA.socket.connected).toBe(true);
      const statuses = () =>
        Promise.all(
          [a, b, c].map(
            async (id) =>
              (await api(app.url, 'GET', `/api/conversations/${id}`, { token: user })).body.status,
          ),
        );
      await until(
        async () =>
          JSON.stringify(await statuses()) === JSON.stringify(['STOPPED', 'RUNNING', 'RUNNING']),
        'statuses',
      );
      expect(await statuses()).toEqual(['STOPPED', 'RUNNING', 'RUNNING']);
      // One eviction, counted once.
      expect(metricGrowth(countedBefore, await metricTotals([app.url], limitCounters))).toEqual({
        cs_limit_evictions_total: 1,
        cs_limit_rejections_total: 0,
      });
    } finally {
      clientA.close();
      clientB.close();
      clientC.close();
    }
  });

  it('refuses bad tokens, other tenants and other users with the documented codes', async () => {
    const id = await createConversation(app, token);
    const query = { conversation_id: id };
    expect((await ConversationClient.refusal(app.url, undefined, query)).message).toBe(
      'UNAUTHORIZED',
    );
    expect((await ConversationClient.refusal(app.url, 'not-a-jwt', query)).message).toBe(
      'UNAUTHORIZED',
    );
    const expired = await sign({ sub: 'alice', tid: tenant }, Math.floor(Date.now() / 1000) - 120);
    const refusal = await ConversationClient.refusal(app.url, expired, query);
    expect(refusal.message).toBe('UNAUTHORIZED');
    expect(refusal.data?.code).toBe('UNAUTHORIZED');
    const noTenant = await sign({ sub: 'alice' });
    expect((await ConversationClient.refusal(app.url, noTenant, query)).message).toBe(
      'UNAUTHORIZED',
    );

    const otherTenant = await sign({ sub: 'alice', tid: uniqueName('other') });
    const otherUser = await sign({ sub: 'bob', tid: tenant });
    const admin = await sign({ sub: 'carol', tid: tenant, roles: ['admin'] });
    for (const stranger of [otherTenant, otherUser]) {
      expect((await ConversationClient.refusal(app.url, stranger, query)).message).toBe(
        'NOT_FOUND',
      );
      const response = await api(app.url, 'GET', `/api/conversations/${id}`, { token: stranger });
      expect(response.status).toBe(404);
      expect(response.body).toMatchObject({ error: { code: 'NOT_FOUND' } });
      const send = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
        token: stranger,
        body: { action: 'message', args: { content: 'x' } },
      });
      expect(send.status).toBe(404);
    }
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token: admin })).status).toBe(
      200,
    );
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, {})).status).toBe(401);
    expect(
      (
        await api(app.url, 'GET', `/api/conversations/${id}`, {
          headers: { authorization: `Bearer ${expired}` },
        })
      ).body,
    ).toMatchObject({ error: { code: 'UNAUTHORIZED' } });
    expect(
      (await ConversationClient.refusal(app.url, token, { conversation_id: 'nope' })).message,
    ).toBe('NOT_FOUND');
    expect(
      (
        await ConversationClient.refusal(app.url, token, {
          conversation_id: id,
          latest_event_id: 'x',
        })
      ).message,
    ).toBe('BAD_REQUEST');
    expect(
      (await ConversationClient.refusal(app.url, token, { conversation_id: id, start: 'maybe' }))
        .message,
    ).toBe('BAD_REQUEST');
  });

  it('answers malformed and oversize input with the documented codes and keeps serving', async () => {
    const id = await createConversation(app, token);
    const client = await ConversationClient.connect(app.url, token, {
      conversation_id: id,
      start: 'false',
    });
    try {
      expect(await client.send({ action: 'dance' })).toMatchObject({
        ok: false,
        error: { code: 'BAD_REQUEST' },
      });
      expect(await client.send('text')).toMatchObject({
        ok: false,
        error: { code: 'BAD_REQUEST' },
      });
      expect(
        await client.send({ action: 'message', args: { content: 'x', extra: 1 } }),
      ).toMatchObject({
        ok: false,
        error: { code: 'BAD_REQUEST', field: 'args.extra' },
      });
      expect(
        await client.send({ action: 'message', args: { content: 'x'.repeat(262_145) } }),
      ).toMatchObject({
        ok: false,
        error: { code: 'BAD_REQUEST', field: 'args.content' },
      });
      expect(
        await client.send({
          action: 'message',
          args: { content: 'x', image_urls: ['y'.repeat(1_100_000)] },
        }),
      ).toMatchObject({ ok: false, error: { code: 'PAYLOAD_TOO_LARGE' } });
      expect(client.socket.connected).toBe(true);
    } finally {
      client.close();
    }

    const bad = async (
      method: string,
      path: string,
      options: Parameters<typeof api>[3],
      status: number,
      field?: string,
    ) => {
      const response = await api(app.url, method, path, { token, ...options });
      expect(response.status, `${method} ${path}`).toBe(status);
      expect(response.body).toMatchObject({
        error: { code: expect.any(String), message: expect.any(String) },
      });
      if (field) expect(response.body.error.field).toBe(field);
      expect(JSON.stringify(response.body)).not.toMatch(/at .*\.js:\d+|SELECT|INSERT/);
      return response;
    };
    await bad('POST', '/api/conversations', { body: { title: 'x', colour: 'red' } }, 400, 'colour');
    await bad('POST', '/api/conversations', { body: { title: 5 } }, 400, 'title');
    await bad(
      'POST',
      '/api/conversations',
      { raw: 'title=x', headers: { 'content-type': 'text/plain' } },
      400,
    );
    await bad(
      'POST',
      '/api/conversations',
      { raw: '{"title":', headers: { 'content-type': 'application/json' } },
      400,
    );
    // Anything but JSON in UTF-8 is a 400 (latin1 was a 415; UTF-16 was decoded as garbage).
    for (const contentType of [
      'application/json; charset=latin1',
      'application/json; charset=utf-16',
      'application/json; charset=utf8',
    ]) {
      const refused = await bad(
        'POST',
        '/api/conversations',
        { raw: '{}', headers: { 'content-type': contentType } },
        400,
      );
      expect(refused.body.error.code, contentType).toBe('BAD_REQUEST');
    }
    const compressed = await bad(
      'POST',
      '/api/conversations',
      {
        raw: '{}',
        headers: { 'content-type': 'application/json', 'content-encoding': 'compress' },
      },
      400,
    );
    expect(compressed.body.error.code).toBe('BAD_REQUEST');
    for (const contentType of [
      'application/json; charset=UTF-8',
      'application/json; charset="utf-8"',
    ]) {
      const created = await api(app.url, 'POST', '/api/conversations', {
        token,
        raw: '{}',
        headers: { 'content-type': contentType },
      });
      expect(created.status, contentType).toBe(201);
    }
    await bad('POST', '/api/conversations', { body: { title: 'x'.repeat(1_100_000) } }, 413);
    await bad('GET', '/api/conversations?limit=0', {}, 400, 'limit');
    await bad('GET', '/api/conversations?limit=abc', {}, 400, 'limit');
    await bad('GET', '/api/conversations?limit=1&limit=2', {}, 400, 'limit');
    await bad('GET', '/api/conversations?limit=', {}, 400, 'limit');
    await bad('GET', '/api/conversations?page_id=garbage', {}, 400, 'page_id');
    await bad('GET', `/api/conversations/${id}/events?limit=101`, {}, 400, 'limit');
    await bad('GET', `/api/conversations/${id}/events?reverse=maybe`, {}, 400, 'reverse');
    await bad('GET', '/api/conversations/not-a-uuid', {}, 404);
    await bad('GET', '/api/conversations/00000000-0000-4000-8000-000000000000', {}, 404);
    await bad(
      'POST',
      `/api/conversations/${id}/events`,
      { body: { action: 'message', args: {} } },
      400,
      'args.content',
    );
    await bad(
      'POST',
      '/api/conversations',
      { body: { conversation_id: 'not-a-uuid' } },
      400,
      'conversation_id',
    );
    // Text Postgres cannot store is refused naming its field (the store's refusal named none).
    await bad(
      'POST',
      `/api/conversations/${id}/events`,
      { body: { action: 'message', args: { content: 'a\u0000b' } } },
      400,
      'args.content',
    );
    await bad(
      'PATCH',
      `/api/conversations/${id}`,
      { body: { metadata: { note: 'half an emoji \ud83d' } } },
      400,
      'metadata.note',
    );
    await bad('POST', '/api/dev/token', { body: { user_id: 'a\u0000' } }, 400, 'user_id');
    // The token is checked before the body is parsed: a stranger's body is never read
    // (malformed JSON without a token was a 400 from the parser, before the 401).
    const stranger = await api(app.url, 'POST', '/api/conversations', {
      raw: `${'['.repeat(100_000)}`,
      headers: { 'content-type': 'application/json' },
    });
    expect(stranger.status).toBe(401);
    expect(stranger.body).toMatchObject({ error: { code: 'UNAUTHORIZED' } });
    // Start and stop take no body but an empty object.
    await bad('POST', `/api/conversations/${id}/stop`, { body: { foo: 1 } }, 400, 'foo');
    await bad('POST', `/api/conversations/${id}/start`, { body: [1] }, 400);
    expect(
      (await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token, body: {} })).status,
    ).toBe(200);
    expect((await api(app.url, 'GET', '/healthz')).status).toBe(200);
  });

  it('pages conversations newest first and events in both directions', async () => {
    const user = await devToken(app.url, { user_id: uniqueName('pager'), tenant_id: tenant });
    const created: string[] = [];
    for (let n = 0; n < 5; n++)
      created.push(await createConversation(app, user, { title: `c${n}` }));
    const seen: string[] = [];
    let page: string | null = null;
    do {
      const query: string = page ? `?limit=2&page_id=${encodeURIComponent(page)}` : '?limit=2';
      const response = await api<{
        results: Array<{ conversation_id: string }>;
        next_page_id: string | null;
      }>(app.url, 'GET', `/api/conversations${query}`, { token: user });
      expect(response.status).toBe(200);
      seen.push(...response.body.results.map((r) => r.conversation_id));
      page = response.body.next_page_id;
    } while (page);
    expect(seen).toEqual([...created].reverse());

    const id = created[0]!;
    const repeat = await api(app.url, 'POST', '/api/conversations', {
      token: user,
      body: { conversation_id: id },
    });
    expect(repeat.status).toBe(200);
    // A "repeat" with a first message the create did not have would drop it (and start
    // the agent for nothing): it is a conflict, as a reused idempotency key.
    const different = await api(app.url, 'POST', '/api/conversations', {
      token: user,
      body: { conversation_id: id, initial_user_msg: 'boo' },
    });
    expect(different.status).toBe(409);
    const events = await api(app.url, 'GET', `/api/conversations/${id}/events`, { token: user });
    expect(events.body.events).toEqual([]);
    const info = await api(app.url, 'GET', `/api/conversations/${id}`, { token: user });
    expect(info.body.status).toBe('STOPPED');
    const taken = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { conversation_id: id },
    });
    expect(taken.status).toBe(409);
  });

  it('serves health, readiness, Prometheus metrics and the OpenAPI document', async () => {
    const actions = ['cs_user_actions_total'] as const;
    const countedBefore = await metricTotals([app.url], actions);
    await createConversation(app, token, { initial_user_msg: 'something to measure' });
    // The create and its first message: two user actions (as RATE_LIMIT_PER_MINUTE counts them).
    expect(metricGrowth(countedBefore, await metricTotals([app.url], actions))).toEqual({
      cs_user_actions_total: 2,
    });
    expect((await api(app.url, 'GET', '/healthz')).body).toEqual({ status: 'ok' });
    expect((await api(app.url, 'GET', '/readyz')).status).toBe(200);
    const metrics = await api<string>(app.url, 'GET', '/metrics');
    expect(metrics.status).toBe(200);
    for (const name of [
      'cs_connected_sockets',
      'cs_running_conversations',
      'cs_event_append_seconds_bucket',
      'cs_user_actions_total',
      'cs_limit_evictions_total',
      'cs_limit_rejections_total',
    ]) {
      expect(metrics.body).toContain(name);
    }
    const openapi = await api(app.url, 'GET', '/docs-json');
    expect(openapi.status).toBe(200);
    expect(Object.keys(openapi.body.paths)).toEqual(
      expect.arrayContaining([
        '/api/conversations',
        '/api/conversations/{id}/events',
        '/api/conversations/{id}/presence',
        '/api/dev/token',
      ]),
    );
    const docs = await fetch(`${app.url}/docs`);
    expect(docs.status).toBe(200);
    expect(docs.headers.get('content-type')).toContain('text/html');
    // The web app: its page loads its bundle from the same origin, and nothing from another.
    const page = await fetch(`${app.url}/`);
    expect(page.headers.get('content-type')).toContain('text/html');
    expect(await page.text()).toMatch(/<script type="module"[^>]* src="\/assets\//);
    const policy = new Map(
      (page.headers.get('content-security-policy') ?? '').split(';').map((directive) => {
        const [name = '', ...sources] = directive.trim().split(/\s+/);
        return [name, sources];
      }),
    );
    expect(policy.get('default-src')).toEqual(["'self'"]);
    expect(policy.get('img-src')).toEqual(["'self'", 'data:']);
    expect(policy.get('script-src')).toEqual(["'self'"]);
    expect(policy.get('connect-src')).toEqual([
      "'self'",
      `ws://127.0.0.1:${app.port}`,
      `wss://127.0.0.1:${app.port}`,
    ]);
    expect(policy.get('object-src')).toEqual(["'none'"]);
    expect(policy.get('frame-src')).toEqual(["'none'"]);
    expect(policy.get('base-uri')).toEqual(["'none'"]);
    expect(policy.get('frame-ancestors')).toEqual(["'none'"]);
    const asset = /src="(\/assets\/[^"]+)"/.exec(await (await fetch(`${app.url}/`)).text())?.[1];
    const script = await fetch(`${app.url}${asset}`);
    expect(script.status).toBe(200);
    expect(script.headers.get('content-security-policy')).toBe(
      page.headers.get('content-security-policy'),
    );
  });

  it('patches, reports state, lists for admins, and deletes conversations', async () => {
    const id = await createConversation(app, token, { title: 'before', metadata: { a: 1 } });
    const patched = await api(app.url, 'PATCH', `/api/conversations/${id}`, {
      token,
      body: { title: 'after', metadata: { b: 2 } },
    });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ conversation_id: id, title: 'after', metadata: { b: 2 } });

    const started = await api(app.url, 'POST', `/api/conversations/${id}/start`, { token });
    expect(started.status).toBe(200);
    expect(['STARTING', 'RUNNING']).toContain(started.body.conversation_status);
    await until(
      async () =>
        (await api(app.url, 'GET', `/api/conversations/${id}/state`, { token })).body
          .agent_state === 'awaiting_user_input',
      'agent ready',
    );
    const state = await api(app.url, 'GET', `/api/conversations/${id}/state`, { token });
    expect(state.body).toMatchObject({
      agent_state: 'awaiting_user_input',
      state: expect.any(Object),
      metrics: {
        iterations: expect.any(Number),
        prompt_tokens: 0,
        completion_tokens: 0,
        cost_usd: 0,
      },
    });
    expect(state.body.runtime).toBeUndefined();
    const admin = await sign({ sub: 'root', tid: tenant, roles: ['admin'] });
    const adminState = await api(app.url, 'GET', `/api/conversations/${id}/state`, {
      token: admin,
    });
    expect(adminState.body.runtime).toMatchObject({
      worker_id: expect.any(String),
      lease_epoch: expect.any(Number),
    });
    const everyone = await api(app.url, 'GET', '/api/conversations?all=true&limit=100', {
      token: admin,
    });
    expect(
      everyone.body.results.map((r: { conversation_id: string }) => r.conversation_id),
    ).toContain(id);
    // From a non-admin, all=true is ignored: only the caller's own conversations.
    const stranger = await devToken(app.url, {
      user_id: uniqueName('stranger'),
      tenant_id: tenant,
    });
    const theirs = await api(app.url, 'GET', '/api/conversations?all=true&limit=100', {
      token: stranger,
    });
    expect(theirs.status).toBe(200);
    expect(theirs.body.results).toEqual([]);

    const stopped = await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token });
    expect(stopped.body).toEqual({ conversation_status: 'STOPPED' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    try {
      expect((await api(app.url, 'DELETE', `/api/conversations/${id}`, { token })).status).toBe(
        204,
      );
      // Every socket of a deleted conversation hears why, and is closed.
      await client.waitFor(
        (events) =>
          events.some((e) => 'status_update' in e && e.id === 'STATUS$CONVERSATION_DELETED'),
        10_000,
        'the deletion notice',
      );
      await until(async () => client.socket.disconnected, 'the socket closed');
    } finally {
      client.close();
    }
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token })).status).toBe(404);
    expect((await api(app.url, 'GET', `/api/conversations/${id}/events`, { token })).status).toBe(
      404,
    );
  });

  it("counts a conversation's sockets (presence); another user's conversation is not found", async () => {
    const id = await createConversation(app, token, { title: 'presence' });
    const other = await createConversation(app, token, { title: 'elsewhere' });
    const presence = (conversationId: string, as = token) =>
      api(app.url, 'GET', `/api/conversations/${conversationId}/presence`, { token: as });
    const counted = async (conversationId: string) =>
      (await presence(conversationId)).body?.sockets as number | undefined;
    expect(await presence(id)).toMatchObject({ status: 200, body: { sockets: 0 } });
    const clients = await Promise.all(
      [id, id, other].map((conversationId) =>
        ConversationClient.connect(app.url, token, {
          conversation_id: conversationId,
          start: 'false',
        }),
      ),
    );
    try {
      await until(async () => (await counted(id)) === 2, 'both sockets counted');
      expect(await presence(id)).toMatchObject({ status: 200, body: { sockets: 2 } });
      expect(await counted(other)).toBe(1);
      const stranger = await devToken(app.url, {
        user_id: uniqueName('stranger'),
        tenant_id: tenant,
      });
      expect((await presence(id, stranger)).status).toBe(404);
      expect((await presence('not-a-uuid')).status).toBe(404);
      clients[0]!.close();
      await until(async () => (await counted(id)) === 1, 'the closed socket no longer counted');
    } finally {
      for (const client of clients) client.close();
    }
  });

  it('streams events over SSE, resumable with Last-Event-ID', async () => {
    const id = await createConversation(app, token, { initial_user_msg: 'from the start' });
    await until(
      async () => (await eventsOf(app, token, id)).some((e) => e.source === 'agent'),
      'initial answer',
    );
    const stored = await eventsOf(app, token, id);
    const controller = new AbortController();
    const response = await fetch(`${app.url}/api/conversations/${id}/stream`, {
      headers: { authorization: `Bearer ${token}`, 'last-event-id': '0' },
      signal: controller.signal,
    });
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toContain('text/event-stream');
    const reader = response.body!.getReader();
    let text = '';
    const last = stored[stored.length - 1]!.id;
    while (!text.includes(`id: ${last}\n`)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    controller.abort();
    const streamed = [...text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]));
    expect(streamed).toEqual(stored.filter((e) => e.id > 0).map((e) => e.id));
  });
});

describe('standalone service lifecycle', () => {
  it('keeps a conversation across a restart on the same DATA_DIR, and refuses a second process', async () => {
    const dir = standaloneDataDir('cs-e2e-');
    const env = { DATA_DIR: dir, AUTH_JWT_SECRET: SECRET, AUTH_DEV_TOKENS: 'true' };
    try {
      let app = await startApp('standalone', env);
      const token = await devToken(app.url, { user_id: 'restart', tenant_id: 'restart' });
      const id = await createConversation(app, token, { initial_user_msg: 'before restart' });
      await until(
        async () => (await eventsOf(app, token, id)).some((e) => e.source === 'agent'),
        'answer',
      );
      const before = await eventsOf(app, token, id);

      await expect(
        startApp('standalone', env, { name: 'second', timeoutMs: 30_000 }),
      ).rejects.toThrow(/DATA_DIR|in use|another process/i);
      expect((await api(app.url, 'GET', '/healthz')).status).toBe(200);

      // Acknowledged just before SIGTERM: stored, and answered after the restart at the latest.
      const acked = await api<{ event_id: number }>(
        app.url,
        'POST',
        `/api/conversations/${id}/events`,
        {
          token,
          body: { action: 'message', args: { content: 'right before the signal' } },
        },
      );
      expect(acked.status).toBe(201);
      expect(await app.stop()).toBe(0);
      app = await startApp('standalone', env);
      const afterRestart = await eventsOf(app, token, id);
      expect(afterRestart.find((e) => e.id === acked.body.event_id)).toMatchObject({
        source: 'user',
        args: { content: 'right before the signal' },
      });
      try {
        expect(afterRestart.slice(0, before.length)).toEqual(before);
        const client = await ConversationClient.connect(app.url, token, {
          conversation_id: id,
          latest_event_id: String(before[before.length - 1]!.id),
        });
        const ack = await client.message('after restart');
        await client.waitForReply(ack.ok ? ack.event_id : -1);
        client.close();
        const after = await eventsOf(app, token, id);
        expect(after.map((e) => e.id)).toEqual(after.map((_, n) => n));
      } finally {
        await app.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('answers every acknowledged message exactly once after kill -9 and a restart, with no client', async () => {
    const dir = standaloneDataDir('cs-e2e-');
    const env = {
      DATA_DIR: dir,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      RATE_LIMIT_PER_MINUTE: '0',
    };
    let app = await startApp('standalone', env);
    try {
      const token = await devToken(app.url, { user_id: 'crash', tenant_id: 'crash' });
      const id = await createConversation(app, token, { initial_user_msg: 'warm up' });
      await until(
        async () => (await eventsOf(app, token, id)).some((e) => e.source === 'agent'),
        'answer',
      );
      const acked = await Promise.all(
        Array.from({ length: 10 }, async (_, n) => {
          const response = await api<{ event_id: number }>(
            app.url,
            'POST',
            `/api/conversations/${id}/events`,
            {
              token,
              body: { action: 'message', args: { content: `burst ${n}` } },
            },
          );
          expect(response.status).toBe(201);
          return response.body.event_id;
        }),
      );
      app.signal('SIGKILL');
      await app.exited;
      app = await startApp('standalone', env);
      const answered = async () => {
        const events = await eventsOf(app, token, id);
        return acked.every((userId) => events.filter((e) => isAgentReply(e, userId)).length === 1);
      };
      await until(answered, 'every acknowledged message answered', 30_000);
      const events = await eventsOf(app, token, id);
      expect(events.map((e) => e.id)).toEqual(events.map((_, n) => n));
      for (const userId of acked) {
        expect(events.filter((e) => e.id === userId && e.source === 'user')).toHaveLength(1);
        expect(events.filter((e) => isAgentReply(e, userId))).toHaveLength(1);
      }
    } finally {
      await app.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('answers RATE_LIMITED beyond RATE_LIMIT_PER_MINUTE and refuses starts under the reject policy', async () => {
    const dir = standaloneDataDir('cs-e2e-');
    const app = await startApp('standalone', {
      DATA_DIR: dir,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      RATE_LIMIT_PER_MINUTE: '5',
      MAX_CONCURRENT_CONVERSATIONS: '1',
      CONCURRENCY_POLICY: 'reject',
    });
    try {
      const token = await devToken(app.url, { user_id: 'busy', tenant_id: 'busy' });
      // Creates count as user actions too: two of the five.
      const id = await createConversation(app, token);
      const other = await createConversation(app, token);
      const path = `/api/conversations/${id}/events`;
      const statuses: number[] = [];
      for (let n = 0; n < 4; n++) {
        const response = await api(app.url, 'POST', path, {
          token,
          body: { action: 'message', args: { content: `m${n}` } },
          headers: { 'idempotency-key': `k${n}` },
        });
        statuses.push(response.status);
        if (n === 0) {
          // The first message started its conversation in the one slot: a start of
          // the other is refused, and counts nothing (a start is a user action).
          const refused = await api(app.url, 'POST', `/api/conversations/${other}/start`, {
            token,
          });
          expect(refused.status).toBe(429);
          expect(refused.body).toMatchObject({ error: { code: 'CONCURRENCY_LIMIT_REACHED' } });
        }
        if (response.status === 429) {
          expect(response.body).toMatchObject({ error: { code: 'RATE_LIMITED' } });
          // Room comes when the first create leaves the 60 s window.
          const retryAfter = Number(response.headers.get('retry-after'));
          expect(retryAfter).toBeGreaterThanOrEqual(50);
          expect(retryAfter).toBeLessThanOrEqual(60);
          expect(response.body.error.message).toBe(
            `too many user actions; retry in ${retryAfter} s`,
          );
        }
      }
      expect(statuses).toEqual([201, 201, 201, 429]);
      // An idempotent repeat does not count and still answers.
      const repeat = await api(app.url, 'POST', path, {
        token,
        body: { action: 'message', args: { content: 'm0' } },
        headers: { 'idempotency-key': 'k0' },
      });
      expect(repeat.status).toBe(200);
    } finally {
      await app.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('stores nothing it refuses with CONCURRENCY_LIMIT_REACHED, counts none of it, and stores it once a slot frees', async () => {
    const dir = standaloneDataDir('cs-e2e-');
    const app = await startApp('standalone', {
      DATA_DIR: dir,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      ...REFUSAL_ENV,
    });
    try {
      const token = await devToken(app.url, { user_id: 'full', tenant_id: uniqueName('full') });
      await refusalStoresNothing([app.url], token);
    } finally {
      await app.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
