// The second hardening review (issue 24), tried from outside against real
// processes: development tokens only for the local host, and the low
// findings (rate limits, replayed events, metadata keys, idempotency keys,
// unfinished Engine.IO handshakes). Each test reproduces one finding.
import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { api } from '../support/clients.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';

const SECRET = 'second-pass-secret-0123456789abcdef-0123';
const ALLOWED_ORIGIN = 'http://app.example.test:8080';

function sign(sub: string, tid: string): Promise<string> {
  return new SignJWT({ tid, roles: [] })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(sub)
    .setExpirationTime(Math.floor(Date.now() / 1000) + 3600)
    .sign(new TextEncoder().encode(SECRET));
}

/** An HTTP request that names `host` in its `Host` header (fetch would not let it). */
function requestAs(
  port: number,
  host: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; body: unknown }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const request = httpRequest(
      {
        host: '127.0.0.1',
        port,
        method,
        path,
        headers: {
          host,
          ...(payload === undefined ? {} : { 'content-type': 'application/json' }),
        },
      },
      (response) => {
        let text = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (text += chunk));
        response.on('end', () => {
          let parsed: unknown = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            // not JSON
          }
          resolve({ status: response.statusCode ?? 0, body: parsed });
        });
      },
    );
    request.on('error', reject);
    request.end(payload);
  });
}

/** A raw Engine.IO WebSocket, opened with `host` in its `Host` header. */
function rawSocket(port: number, query: string, host?: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(
      `ws://127.0.0.1:${port}/socket.io/?EIO=4&transport=websocket${query}`,
      host === undefined ? {} : { headers: { host } },
    );
    ws.once('error', reject);
    // Engine.IO's open packet: the connection is up, no Socket.IO CONNECT sent yet.
    ws.once('message', () => resolve(ws));
  });
}

/** Sends the Socket.IO CONNECT with `token`; resolves with the server's answer packet. */
function socketIoConnect(ws: WebSocket, token: string): Promise<string> {
  return new Promise((resolve) => {
    ws.once('message', (data: Buffer) => resolve(data.toString()));
    ws.send(`40${JSON.stringify({ token })}`);
  });
}

/** Resolves once the server closed `ws`, or rejects after `deadlineMs`. */
function closedWithin(ws: WebSocket, deadlineMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    if (ws.readyState === WebSocket.CLOSED) return resolve();
    const timer = setTimeout(
      () => reject(new Error(`still open after ${deadlineMs} ms`)),
      deadlineMs,
    );
    ws.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

describe('hardening, second pass: a standalone app with development tokens on', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  const tenant = uniqueName('second-pass');

  beforeAll(async () => {
    db = await createScratchDatabase('cs_second_pass', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AUTH_DEV_TOKENS: 'true',
      CORS_ORIGINS: ALLOWED_ORIGIN,
      RATE_LIMIT_PER_MINUTE: '8',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  it('refuses requests and socket handshakes whose Host is not loopback nor a CORS origin (DNS rebinding)', async () => {
    const rebound = `rebound.example:${app.port}`;
    for (const [method, path] of [
      ['POST', '/api/dev/token'],
      ['GET', '/api/conversations'],
      ['GET', '/'],
      ['OPTIONS', '/api/dev/token'],
    ] as const) {
      const refused = await requestAs(
        app.port,
        rebound,
        method,
        path,
        method === 'POST' ? {} : undefined,
      );
      expect(refused, `${method} ${path}`).toMatchObject({
        status: 400,
        body: { error: { code: 'BAD_REQUEST', field: 'Host' } },
      });
    }
    // Probes reach a pod by its address.
    expect((await requestAs(app.port, rebound, 'GET', '/healthz')).status).toBe(200);

    for (const host of [
      `localhost:${app.port}`,
      `127.0.0.1:${app.port}`,
      `[::1]:${app.port}`,
      'app.example.test',
    ]) {
      const minted = await requestAs(app.port, host, 'POST', '/api/dev/token', {});
      expect(minted.status, host).toBe(201);
      expect(minted.body).toMatchObject({ token: expect.any(String) });
    }

    const token = await sign(uniqueName('host'), tenant);
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    const query = `&conversation_id=${id}&start=false`;
    const refusedSocket = await rawSocket(app.port, query, rebound);
    const refusal = await socketIoConnect(refusedSocket, token);
    expect(refusal.startsWith('44')).toBe(true);
    expect(JSON.parse(refusal.slice(2))).toMatchObject({
      message: 'BAD_REQUEST',
      data: { code: 'BAD_REQUEST', field: 'Host' },
    });
    refusedSocket.close();
    const allowed = await rawSocket(app.port, query, `localhost:${app.port}`);
    expect((await socketIoConnect(allowed, token)).startsWith('40')).toBe(true);
    allowed.close();
  });

  it('refuses an Idempotency-Key header and a body client_event_id that differ, storing nothing', async () => {
    const token = await sign(uniqueName('keys'), tenant);
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    const message = (key: string) => ({
      action: 'message',
      args: { content: 'hello' },
      client_event_id: key,
    });
    const refused = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
      token,
      body: message('body-key'),
      headers: { 'idempotency-key': 'header-key' },
    });
    expect(refused.status).toBe(400);
    expect(refused.body.error).toMatchObject({ code: 'BAD_REQUEST', field: 'client_event_id' });
    const events = await api(app.url, 'GET', `/api/conversations/${id}/events`, { token });
    expect(events.body.events).toEqual([]);
    // The same key in both places is one key.
    const same = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
      token,
      body: message('one-key'),
      headers: { 'idempotency-key': 'one-key' },
    });
    expect(same.status).toBe(201);
  });

  it('refuses a metadata or agent_config key __proto__ naming the field, never drops it', async () => {
    const token = await sign(uniqueName('proto'), tenant);
    const id = randomUUID();
    const create = (raw: string) =>
      api(app.url, 'POST', '/api/conversations', {
        token,
        raw,
        headers: { 'content-type': 'application/json' },
      });
    const refused = await create(
      `{"conversation_id":"${id}","metadata":{"__proto__":{"admin":true},"kept":1}}`,
    );
    expect(refused.status).toBe(400);
    expect(refused.body.error).toMatchObject({ code: 'BAD_REQUEST', field: 'metadata.__proto__' });
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token })).status).toBe(404);
    const config = await create(`{"agent_config":{"__proto__":{}}}`);
    expect(config.body.error).toMatchObject({ field: 'agent_config.__proto__' });

    const created = await create(`{"conversation_id":"${id}","metadata":{"kept":1}}`);
    expect(created.status).toBe(201);
    const patched = await api(app.url, 'PATCH', `/api/conversations/${id}`, {
      token,
      raw: '{"metadata":{"__proto__":{"x":1}}}',
      headers: { 'content-type': 'application/json' },
    });
    expect(patched.status).toBe(400);
    expect(patched.body.error).toMatchObject({ field: 'metadata.__proto__' });
    const info = await api(app.url, 'GET', `/api/conversations/${id}`, { token });
    expect(info.body.metadata).toEqual({ kept: 1 });
    // Deeper down it is kept as sent.
    const nested = await api(app.url, 'PATCH', `/api/conversations/${id}`, {
      token,
      raw: '{"metadata":{"a":{"__proto__":{"x":1}}}}',
      headers: { 'content-type': 'application/json' },
    });
    expect(nested.status).toBe(200);
    expect(JSON.stringify(nested.body.metadata)).toBe('{"a":{"__proto__":{"x":1}}}');
  });

  it('holds replay_json events to the limits of live input, naming the event, and stores none of it', async () => {
    const token = await sign(uniqueName('replay'), tenant);
    const id = randomUUID();
    const message = (source: string, content: string) => ({
      source,
      action: 'message',
      args: { content },
      message: '',
    });
    const refused = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: {
        conversation_id: id,
        replay_json: JSON.stringify([
          message('user', 'hi'),
          message('agent', 'hello'),
          message('user', 'more'),
          message('agent', 'x'.repeat(900_000)),
        ]),
      },
    });
    expect(refused.status).toBe(400);
    expect(refused.body.error).toMatchObject({
      code: 'BAD_REQUEST',
      field: 'replay_json[3].args.content',
    });
    expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token })).status).toBe(404);
    const unstorable = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { replay_json: JSON.stringify([message('user', 'a\u0000b')]) },
    });
    expect(unstorable.status).toBe(400);
    expect(unstorable.body.error).toMatchObject({ field: 'replay_json[0].args.content' });
  });

  it('counts POST …/start and …/stop against RATE_LIMIT_PER_MINUTE', async () => {
    const token = await sign(uniqueName('start-stop'), tenant);
    const id = (await api(app.url, 'POST', '/api/conversations', { token, body: {} })).body
      .conversation_id as string;
    // The create was one action of 8: seven starts and stops fit, the next is refused.
    const answers = [];
    for (let n = 0; n < 8; n++) {
      const route = n % 2 === 0 ? 'start' : 'stop';
      answers.push(await api(app.url, 'POST', `/api/conversations/${id}/${route}`, { token }));
    }
    expect(answers.slice(0, 7).map((answer) => answer.status)).toEqual([
      200, 200, 200, 200, 200, 200, 200,
    ]);
    expect(answers[7]).toMatchObject({ status: 429, body: { error: { code: 'RATE_LIMITED' } } });
  });

  it('closes Engine.IO connections that never send a Socket.IO CONNECT, and caps them per address', async () => {
    const idle = await rawSocket(app.port, '');
    await closedWithin(idle, 15_000);

    // 128 at once are let in; the next from the same address is refused.
    const waiting = await Promise.all(Array.from({ length: 128 }, () => rawSocket(app.port, '')));
    // Engine.IO refuses a connection its allowRequest turns down with 400.
    await expect(rawSocket(app.port, '')).rejects.toThrow(/Unexpected server response: 400/);
    for (const ws of waiting) ws.close();
    await Promise.all(waiting.map((ws) => closedWithin(ws, 15_000)));
    const again = await rawSocket(app.port, '');
    again.close();
  });
});

describe('hardening, second pass: a standalone app with development tokens off', () => {
  let app: AppProcess;
  let db: ScratchDatabase;

  beforeAll(async () => {
    db = await createScratchDatabase('cs_second_pass_off', { migrated: true });
    app = await startApp('standalone', { DATABASE_URL: db.url, AUTH_JWT_SECRET: SECRET });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  it('answers any Host (an operator puts it behind its own names)', async () => {
    const token = await sign(uniqueName('any-host'), uniqueName('tenant'));
    const host = `conversations.example.com:${app.port}`;
    const created = await requestAs(app.port, host, 'POST', '/api/conversations', {});
    expect(created.status).toBe(401);
    const socket = await rawSocket(app.port, `&conversation_id=${randomUUID()}`, host);
    // Past the Host check: the conversation does not exist.
    expect(await socketIoConnect(socket, token)).toContain('NOT_FOUND');
    socket.close();
  });
});
