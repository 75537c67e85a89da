// The attacks of the hardening review, tried from outside against real
// processes: each test reproduces one finding and checks that it holds now.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect, type Socket as NetSocket } from 'node:net';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import type { ServerEvent } from '@cs/protocol';
import { ConversationClient, api, devToken, openSse } from '../support/clients.js';
import { CLUSTER_SECRET, startCluster, until, type TestCluster } from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';

const SECRET = 'hardening-secret-0123456789abcdef-0123';

async function sign(
  secret: string,
  claims: { sub: string; tid: string; roles?: string[] },
  expiresInS = 3600,
): Promise<string> {
  return new SignJWT({ tid: claims.tid, roles: claims.roles ?? [] })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(claims.sub)
    .setExpirationTime(Math.floor(Date.now() / 1000) + expiresInS)
    .sign(new TextEncoder().encode(secret));
}

/** Resident memory of a process, from /proc (bytes). */
function rssOf(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = /VmRSS:\s+(\d+)\s+kB/.exec(status)?.[1];
  return Number(kb) * 1024;
}

/** A gauge of the process's /metrics. */
async function gauge(app: AppProcess, name: string): Promise<number> {
  const text = await (await fetch(`${app.url}/metrics`)).text();
  return Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\d+)`, 'm').exec(text)?.[1] ?? NaN);
}

function isStatus(event: ServerEvent, id: string): boolean {
  return 'status_update' in event && event.id === id;
}

/** An HTTP request on a raw TCP socket that never reads what comes back. */
function stalledRequest(port: number, request: string): Promise<NetSocket> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(request);
      socket.pause(); // never read: the server's writes back up
      resolve(socket);
    });
    socket.on('error', reject);
  });
}

/** What the server answers to a raw request, read until it closes the connection. */
function rawExchange(port: number, request: string): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve, reject) => {
    let text = '';
    const socket = connect(port, '127.0.0.1', () => socket.write(request));
    const timer = setTimeout(() => {
      socket.destroy();
      resolve({ text, closed: false });
    }, 5_000);
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (text += chunk));
    socket.on('close', () => {
      clearTimeout(timer);
      resolve({ text, closed: true });
    });
    socket.on('error', (error) => (text ? undefined : reject(error)));
  });
}

/** A GET whose path is sent byte for byte (fetch would normalise dot segments). */
function getAsIs(
  url: string,
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; contentType: string; body: string }> {
  return new Promise((resolve, reject) => {
    const request = httpRequest(`${url}/`, { path, headers }, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body += chunk));
      response.on('end', () =>
        resolve({
          status: response.statusCode ?? 0,
          contentType: response.headers['content-type'] ?? '',
          body,
        }),
      );
    });
    request.on('error', reject);
    request.end();
  });
}

/** A Socket.IO connection over a raw WebSocket that stops reading once connected. */
function stalledSocket(port: number, token: string, conversationId: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(
      `ws://127.0.0.1:${port}/socket.io/?EIO=4&transport=websocket&conversation_id=${conversationId}&start=false`,
    );
    ws.on('error', reject);
    ws.once('message', () => {
      ws.send(`40${JSON.stringify({ token })}`);
      ws.once('message', () => {
        (ws as unknown as { _socket: NetSocket })._socket.pause();
        resolve(ws);
      });
    });
  });
}

describe('hardening: the standalone app', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  const tenant = uniqueName('hardening');

  beforeAll(async () => {
    db = await createScratchDatabase('cs_hardening', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      RATE_LIMIT_PER_MINUTE: '50',
      MAX_CONNECTIONS_PER_USER: '20',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  const tokenOf = (user: string, tid = tenant) => sign(SECRET, { sub: user, tid });

  it('closes the sockets and streams of a deleted conversation; the id reused by another user reaches none of them', async () => {
    const alice = await tokenOf(uniqueName('alice'));
    const bob = await tokenOf(uniqueName('bob'));
    const id = randomUUID();
    const created = await api(app.url, 'POST', '/api/conversations', {
      token: alice,
      body: { conversation_id: id, initial_user_msg: 'alice here' },
    });
    expect(created.status).toBe(201);
    const socket = await ConversationClient.connect(app.url, alice, { conversation_id: id });
    const stream = await openSse(app.url, alice, id);
    await socket.waitFor((events) => events.some((e) => 'source' in e && e.source === 'agent'));

    expect(
      (await api(app.url, 'DELETE', `/api/conversations/${id}`, { token: alice })).status,
    ).toBe(204);
    await socket.waitFor((events) =>
      events.some((e) => isStatus(e, 'STATUS$CONVERSATION_DELETED')),
    );
    await until(async () => socket.socket.disconnected, 'the socket closed');
    await stream.ended;
    expect(stream.text()).toContain('STATUS$CONVERSATION_DELETED');

    // Bob, of the same tenant, takes the id: nothing of his reaches Alice's connections.
    const reused = await api(app.url, 'POST', '/api/conversations', {
      token: bob,
      body: { conversation_id: id, initial_user_msg: 'bob secret' },
    });
    expect(reused.status).toBe(201);
    await until(
      async () =>
        (await api(app.url, 'GET', `/api/conversations/${id}/events`, { token: bob })).body.events
          .length >= 4,
      'bob answered',
    );
    expect(JSON.stringify(socket.events)).not.toContain('bob secret');
    expect(stream.text()).not.toContain('bob secret');
    // Alice does not see Bob's conversation either.
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token: alice })).status).toBe(
      404,
    );
    socket.close();
  });

  it('closes a socket and a stream when their token expires', async () => {
    const user = uniqueName('expiring');
    const lasting = await tokenOf(user);
    const id = (await api(app.url, 'POST', '/api/conversations', { token: lasting, body: {} })).body
      .conversation_id as string;
    const shortLived = await sign(SECRET, { sub: user, tid: tenant }, 2);
    const socket = await ConversationClient.connect(app.url, shortLived, {
      conversation_id: id,
      start: 'false',
    });
    const stream = await openSse(app.url, shortLived, id);
    const started = Date.now();
    await socket.waitFor(
      (events) => events.some((e) => isStatus(e, 'STATUS$TOKEN_EXPIRED')),
      10_000,
    );
    await until(async () => socket.socket.disconnected, 'the socket closed');
    await stream.ended;
    expect(stream.text()).toContain('STATUS$TOKEN_EXPIRED');
    // Closed at its exp (2 s), well within the 30 s the contract allows.
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('keeps a socket opened with a token just past its exp (within the 30 s tolerance) open, as REST accepts it', async () => {
    const user = uniqueName('skewed');
    const skewed = await sign(SECRET, { sub: user, tid: tenant }, -5);
    const created = await api(app.url, 'POST', '/api/conversations', { token: skewed, body: {} });
    expect(created.status).toBe(201);
    const socket = await ConversationClient.connect(app.url, skewed, {
      conversation_id: created.body.conversation_id as string,
      start: 'false',
    });
    // The server has set the connection up and answers on it (an expiry at connect
    // would have come first, and closed it).
    expect(await socket.send({ action: 'dance' })).toMatchObject({
      ok: false,
      error: { code: 'BAD_REQUEST' },
    });
    // It lasts to the end of the tolerance (25 s from here), not a moment.
    expect(socket.socket.connected).toBe(true);
    expect(socket.events.some((e) => isStatus(e, 'STATUS$TOKEN_EXPIRED'))).toBe(false);
    socket.close();
  });

  it('refuses connections beyond MAX_CONNECTIONS_PER_USER, sockets and streams together', async () => {
    const token = await tokenOf(uniqueName('hoarder'));
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    const sockets = [];
    for (let n = 0; n < 15; n++) {
      sockets.push(
        await ConversationClient.connect(app.url, token, { conversation_id: id, start: 'false' }),
      );
    }
    const streams = [];
    for (let n = 0; n < 5; n++) streams.push(await openSse(app.url, token, id));
    const refused = await ConversationClient.refusal(app.url, token, { conversation_id: id });
    expect(refused.message).toBe('RATE_LIMITED');
    const sse = await fetch(`${app.url}/api/conversations/${id}/stream`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(sse.status).toBe(429);
    expect(await sse.json()).toMatchObject({ error: { code: 'RATE_LIMITED' } });
    // A place given back can be taken again.
    sockets.pop()!.close();
    await until(async () => {
      const again = await ConversationClient.connect(app.url, token, {
        conversation_id: id,
        start: 'false',
      }).catch(() => null);
      if (again) sockets.push(again);
      return again !== null;
    }, 'a place given back');
    for (const socket of sockets) socket.close();
    for (const stream of streams) stream.abort();
  });

  it('frees what an SSE request took when its client leaves during authentication or the lookup', async () => {
    const token = await tokenOf(uniqueName('leaver'));
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    const request =
      `GET /api/conversations/${id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n` +
      `Authorization: Bearer ${token}\r\n\r\n`;
    for (let n = 0; n < 100; n++) {
      const socket = await stalledRequest(app.port, request);
      socket.destroy(); // gone before the server has answered
    }
    await until(
      async () => (await gauge(app, 'cs_open_event_streams')) === 0,
      'no stream left open',
      10_000,
    );
    // And the user's connection places all came back.
    const streams = [];
    for (let n = 0; n < 20; n++) streams.push(await openSse(app.url, token, id));
    for (const stream of streams) stream.abort();
  });

  it('refuses a socket without conversation_id with BAD_REQUEST', async () => {
    const token = await tokenOf(uniqueName('careless'));
    const refused = await ConversationClient.refusal(app.url, token, {});
    expect(refused.message).toBe('BAD_REQUEST');
    expect(refused.data).toMatchObject({ code: 'BAD_REQUEST' });
  });

  it('serves no development token with an operator secret, and no CORS to a foreign origin', async () => {
    const minted = await api(app.url, 'POST', '/api/dev/token', {
      body: { user_id: 'mallory', tenant_id: tenant, roles: ['admin'] },
    });
    expect(minted.status).toBe(404);
    const foreign = 'https://evil.example';
    const preflight = await fetch(`${app.url}/api/conversations`, {
      method: 'OPTIONS',
      headers: { origin: foreign, 'access-control-request-method': 'POST' },
    });
    expect(preflight.headers.get('access-control-allow-origin')).toBeNull();
    const token = await tokenOf(uniqueName('victim'));
    const listed = await fetch(`${app.url}/api/conversations`, {
      headers: { origin: foreign, authorization: `Bearer ${token}` },
    });
    expect(listed.headers.get('access-control-allow-origin')).toBeNull();
    // A page of another origin cannot open a socket either.
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    const opened = await new Promise<boolean>((resolve) => {
      const ws = new WebSocket(
        `ws://127.0.0.1:${app.port}/socket.io/?EIO=4&transport=websocket&conversation_id=${id}`,
        { headers: { origin: foreign } },
      );
      ws.once('open', () => {
        ws.close();
        resolve(true);
      });
      ws.once('error', () => resolve(false));
      ws.once('unexpected-response', () => resolve(false));
    });
    expect(opened).toBe(false);
  });

  it('answers headers over 16 KiB with the JSON error body; other malformed requests get a bare 400', async () => {
    const tooLarge = await rawExchange(
      app.port,
      `GET /api/conversations HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ${'a'.repeat(20 * 1024)}\r\n\r\n`,
    );
    expect(tooLarge.closed).toBe(true);
    const [head = '', body = ''] = tooLarge.text.split('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.1 400 /);
    expect(head).toMatch(/^content-type: application\/json/im);
    expect(JSON.parse(body)).toEqual({
      error: { code: 'BAD_REQUEST', message: expect.stringContaining('16 KiB') },
    });
    // A query string that long is refused the same way.
    const query = await rawExchange(
      app.port,
      `GET /api/conversations?x=${'a'.repeat(20 * 1024)} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`,
    );
    expect(query.text).toMatch(/^HTTP\/1\.1 400 [^]*"code":"BAD_REQUEST"/);

    const malformed = await rawExchange(app.port, 'NOT HTTP AT ALL\r\n\r\n');
    expect(malformed.closed).toBe(true);
    expect(malformed.text).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect((await api(app.url, 'GET', '/healthz')).status).toBe(200);
  });

  it("answers the service's paths from the service, never with the web app's files", async () => {
    const token = await tokenOf(uniqueName('walker'));
    const headers = { authorization: `Bearer ${token}` };
    for (const path of [
      '/api/conversations/..%2f..%2findex.html',
      '/api/conversations/%2e%2e%2f%2e%2e',
      '/API/conversations/..%2F..%2Findex.html',
      '/api/index.html',
      '/docs/..%2findex.html',
      '/healthz/..%2findex.html',
      '/readyz/index.html',
      '/metrics/..%2f',
    ]) {
      const response = await getAsIs(app.url, path, headers);
      expect(response.status, path).toBe(404);
      expect(response.contentType, path).toMatch(/^application\/json/);
      expect(JSON.parse(response.body), path).toMatchObject({ error: { code: 'NOT_FOUND' } });
    }
    // Socket.IO answers its own path (its JSON), not with the page.
    const engine = await getAsIs(app.url, '/socket.io/..%2findex.html', headers);
    expect(engine.contentType).toMatch(/^application\/json/);
    // The page itself is still there.
    const page = await getAsIs(app.url, '/', {});
    expect(page.status).toBe(200);
    expect(page.contentType).toMatch(/^text\/html/);
  });

  it('counts replayed events against the rate limit, caps them, and never answers them again', async () => {
    const token = await tokenOf(uniqueName('replayer'));
    const history = (count: number) =>
      JSON.stringify(
        Array.from({ length: count }, (_, n) =>
          n % 2 === 0
            ? { source: 'user', action: 'message', args: { content: `question ${n}` }, message: '' }
            : { source: 'agent', action: 'message', args: { content: `answer ${n}` }, message: '' },
        ),
      );
    // 50 a minute: a replay of 60 events does not fit, and stores nothing.
    const tooMany = randomUUID();
    const refused = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { conversation_id: tooMany, replay_json: history(60) },
    });
    expect(refused.status).toBe(429);
    expect((await api(app.url, 'GET', `/api/conversations/${tooMany}`, { token })).status).toBe(
      404,
    );
    const capped = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { replay_json: history(1001) },
    });
    expect(capped.status).toBe(400);

    const created = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { replay_json: history(6) },
    });
    expect(created.status).toBe(201);
    const id = created.body.conversation_id as string;
    const socket = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const ack = await socket.message('a new question');
    expect(ack).toMatchObject({ ok: true });
    const newId = (ack as { event_id: number }).event_id;
    await socket.waitForReply(newId);
    const answers = socket.stored.filter((e) => e.source === 'agent' && e.id > newId);
    // Only the new question is answered: none of the three replayed ones again
    // (the echo agent answers in id order, so they would have come first).
    expect(answers.map((e) => e.cause)).toEqual([newId]);
    socket.close();

    // A replayed state change is history, not the new conversation's state:
    // one that says `running` does not make the agent busy (under `reject`).
    const running = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: {
        multitask_strategy: 'reject',
        replay_json: JSON.stringify([
          { source: 'user', action: 'message', args: { content: 'old question' }, message: '' },
          {
            source: 'environment',
            observation: 'agent_state_changed',
            content: '',
            extras: { agent_state: 'running' },
            message: '',
          },
        ]),
      },
    });
    expect(running.status).toBe(201);
    const replayed = running.body.conversation_id as string;
    const next = await api(app.url, 'POST', `/api/conversations/${replayed}/events`, {
      token,
      body: { action: 'message', args: { content: 'a new question' } },
    });
    expect(next.status, JSON.stringify(next.body)).toBe(201);
  });

  it('stores a create and its first message together or not at all, and a retry converges', async () => {
    const token = await tokenOf(uniqueName('retrier'));
    const id = randomUUID();
    // Refused halfway: the replay is invalid. Nothing of it is stored.
    const refused = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { conversation_id: id, initial_user_msg: 'first', replay_json: '[{"source":"user"}]' },
    });
    expect(refused.status).toBe(400);
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token })).status).toBe(404);
    const retried = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { conversation_id: id, initial_user_msg: 'first' },
    });
    expect(retried.status).toBe(201);
    const again = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { conversation_id: id, initial_user_msg: 'first' },
    });
    expect(again.status).toBe(200);
    await until(
      async () =>
        (await api(app.url, 'GET', `/api/conversations/${id}/events`, { token })).body.events.some(
          (e: { source: string }) => e.source === 'agent',
        ),
      'the first message answered',
    );
    const { events } = (
      await api(app.url, 'GET', `/api/conversations/${id}/events?limit=100`, { token })
    ).body;
    expect(events.filter((e: { source: string }) => e.source === 'user')).toHaveLength(1);
  });

  it('cuts event pages by bytes and keeps memory bounded under clients that never read', async () => {
    const token = await tokenOf(uniqueName('hoard'));
    // An admin of the tenant posts the live traffic, under a rate limit of its own.
    const poster = await sign(SECRET, { sub: uniqueName('poster'), tid: tenant, roles: ['admin'] });
    const big = 'x'.repeat(250_000);
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    // 40 large messages and their 40 echoes: about 20 MB of history.
    for (let n = 0; n < 40; n++) {
      const sent = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
        token,
        body: { action: 'message', args: { content: `${n} ${big}` } },
      });
      expect(sent.status).toBe(201);
    }
    await until(
      async () =>
        (await api(app.url, 'GET', `/api/conversations/${id}`, { token })).body.last_event_id >= 80,
      'the echoes',
      30_000,
    );
    // A page holds at most 4 MiB: about 16 of these events, then has_more.
    const page = await api(app.url, 'GET', `/api/conversations/${id}/events?limit=100`, { token });
    expect(page.body.has_more).toBe(true);
    expect(page.body.events.length).toBeLessThan(20);
    expect(JSON.stringify(page.body).length).toBeLessThanOrEqual(4 * 1024 * 1024 + 64 * 1024);

    const before = rssOf(app.child.pid!);
    const readers: NetSocket[] = [];
    const sockets: WebSocket[] = [];
    for (let n = 0; n < 6; n++) {
      readers.push(
        await stalledRequest(
          app.port,
          `GET /api/conversations/${id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\n\r\n`,
        ),
      );
    }
    for (let n = 0; n < 4; n++) sockets.push(await stalledSocket(app.port, token, id));
    // Measured once the server holds them all and its memory has stopped growing
    // (four readings 250 ms apart within 4 MB of each other), or has grown too much.
    await until(
      async () =>
        (await gauge(app, 'cs_open_event_streams')) >= 6 &&
        (await gauge(app, 'cs_connected_sockets')) >= 4,
      'the stalled clients served',
      30_000,
    );
    const readings: number[] = [];
    await until(
      () => {
        readings.push(rssOf(app.child.pid!));
        const last = readings.slice(-4);
        return (
          last.at(-1)! - before >= 200 * 1024 * 1024 ||
          (last.length === 4 && Math.max(...last) - Math.min(...last) < 4 * 1024 * 1024)
        );
      },
      'the memory to stop growing',
      30_000,
      250,
    );
    const grown = rssOf(app.child.pid!) - before;
    // Was 1.6 GB for six such streams: the replay now waits for each client.
    expect(grown).toBeLessThan(200 * 1024 * 1024);

    // Live traffic that keeps coming for them closes them once 8 MiB wait unsent.
    for (let n = 0; n < 40; n++) {
      const sent = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
        token: poster,
        body: { action: 'message', args: { content: `${n} ${'y'.repeat(250_000)}` } },
      });
      expect(sent.status).toBe(201);
    }
    await until(
      async () => (await gauge(app, 'cs_open_event_streams')) === 0,
      'the stalled streams closed',
      30_000,
    );
    await until(
      async () => (await gauge(app, 'cs_connected_sockets')) === 0,
      'the stalled sockets closed',
      30_000,
    );
    // Their clients, reading again, find the connections ended.
    const ended = [
      ...readers.map(
        (socket) => new Promise<void>((resolve) => socket.on('close', () => resolve())),
      ),
      ...sockets.map((ws) => new Promise<void>((resolve) => ws.on('close', () => resolve()))),
    ];
    for (const socket of readers) socket.resume();
    for (const ws of sockets) (ws as unknown as { _socket: NetSocket })._socket.resume();
    await Promise.all(ended);
    expect(rssOf(app.child.pid!) - before).toBeLessThan(300 * 1024 * 1024);
  });
});

describe('hardening: a cluster', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({ gateways: 2, workers: 1 });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  it('a reused id of another tenant reaches no socket or stream of the deleted conversation, on any gateway', async () => {
    const [a, b] = cluster.gateways as [AppProcess, AppProcess];
    const owner = await cluster.token(uniqueName('owner'));
    const id = randomUUID();
    expect(
      (
        await api(a.url, 'POST', '/api/conversations', {
          token: owner,
          body: { conversation_id: id, initial_user_msg: 'mine' },
        })
      ).status,
    ).toBe(201);
    const socket = await ConversationClient.connect(a.url, owner, { conversation_id: id });
    const stream = await openSse(a.url, owner, id);
    await socket.waitFor((events) => events.some((e) => 'source' in e && e.source === 'agent'));
    // Deleted through the other gateway: gateway A's connections hear it too.
    expect((await api(b.url, 'DELETE', `/api/conversations/${id}`, { token: owner })).status).toBe(
      204,
    );
    await socket.waitFor((events) =>
      events.some((e) => isStatus(e, 'STATUS$CONVERSATION_DELETED')),
    );
    await until(async () => socket.socket.disconnected, 'the socket closed');
    await stream.ended;

    const stranger = await sign(CLUSTER_SECRET, {
      sub: 'intruder',
      tid: uniqueName('other-tenant'),
    });
    expect(
      (
        await api(b.url, 'POST', '/api/conversations', {
          token: stranger,
          body: { conversation_id: id, initial_user_msg: 'other tenant secret' },
        })
      ).status,
    ).toBe(201);
    await until(
      async () =>
        (
          await api(b.url, 'GET', `/api/conversations/${id}/events`, { token: stranger })
        ).body.events.some((e: { source: string }) => e.source === 'agent'),
      'the other tenant answered',
    );
    expect(JSON.stringify(socket.events)).not.toContain('other tenant secret');
    expect(stream.text()).not.toContain('other tenant secret');
    expect((await api(a.url, 'GET', `/api/conversations/${id}`, { token: owner })).status).toBe(
      404,
    );
    socket.close();
  });

  it('refuses development tokens on a gateway unless AUTH_DEV_TOKENS is set', async () => {
    // The suite's cluster opts in; a gateway started without it serves none.
    const gateway = await startApp('gateway', { ...cluster.env, AUTH_DEV_TOKENS: '' });
    try {
      const minted = await devToken(gateway.url, { user_id: 'x' }).catch(
        (error: Error) => error.message,
      );
      expect(minted).toContain('404');
    } finally {
      await gateway.stop();
    }
  });
});
