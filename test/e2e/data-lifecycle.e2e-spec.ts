// PROTOCOL.md "Data lifecycle" and the export of "Branching", end to end on
// the built standalone app, on PGlite and on Postgres: a conversation's
// export (REST and SDK) read back through replay_json, the erasure of a user,
// retention with a short RETENTION_DAYS, the export of a user and the audit
// trail, with the access rules of each.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient, type ConversationExportLine } from '@cs/client';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, devToken } from '../support/clients.js';
import { readAllEvents, until } from '../support/cluster.js';
import { metricTotals } from '../support/metrics.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';

interface Backend {
  name: string;
  env(): Promise<{ env: Record<string, string>; cleanup: () => Promise<void> }>;
}

const backends: Backend[] = [
  {
    name: 'PGlite',
    async env() {
      const dir = mkdtempSync(join(tmpdir(), 'cs-lifecycle-'));
      return {
        env: { DATA_DIR: dir },
        cleanup: async () => rmSync(dir, { recursive: true, force: true }),
      };
    },
  },
  {
    name: 'Postgres',
    async env() {
      const db: ScratchDatabase = await createScratchDatabase('cs_lifecycle');
      const dir = mkdtempSync(join(tmpdir(), 'cs-lifecycle-'));
      return {
        env: { DATABASE_URL: db.url, DATA_DIR: dir },
        cleanup: async () => {
          await db.drop();
          rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  },
];

/** The lines of an NDJSON body. */
function ndjson(text: string): unknown[] {
  return text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line) as unknown);
}

/** What a replayed history must keep: each event's source and body, without its place. */
function history(events: readonly StoredEvent[]): unknown[] {
  return events
    .filter((event) => !('observation' in event && event.observation === 'agent_state_changed'))
    .map((event) => {
      const {
        id: _id,
        timestamp: _t,
        cause: _c,
        client_event_id: _k,
        ...body
      } = event as StoredEvent & {
        client_event_id?: string;
      };
      return body;
    });
}

describe.each(backends)('data lifecycle on the standalone app ($name)', (backend) => {
  let app: AppProcess;
  let cleanup: () => Promise<void>;
  const tenant = uniqueName('tenant');
  const token = (userId: string, roles: string[] = []) =>
    devToken(app.url, { user_id: userId, tenant_id: tenant, roles });

  beforeAll(async () => {
    const prepared = await backend.env();
    cleanup = prepared.cleanup;
    app = await startApp('standalone', {
      ...prepared.env,
      AUTH_DEV_TOKENS: 'true',
      RATE_LIMIT_PER_MINUTE: '0',
      MAX_CONCURRENT_CONVERSATIONS: '20',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await cleanup?.();
  });

  /** A conversation of `userId` whose echo agent answered `messages`. */
  async function conversationWith(userToken: string, messages: string[]): Promise<string> {
    const created = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
      token: userToken,
      body: { title: 'to export', metadata: { kept: true } },
    });
    expect(created.status).toBe(201);
    const id = created.body.conversation_id;
    for (const [index, content] of messages.entries()) {
      const sent = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
        token: userToken,
        body: { action: 'message', args: { content }, client_event_id: `m${index}` },
      });
      expect(sent.status).toBe(201);
      await until(async () => {
        const events = await readAllEvents(app.url, userToken, id);
        return events.some(
          (event) =>
            'action' in event && event.source === 'agent' && event.cause === sent.body.event_id,
        );
      }, `the answer to ${content}`);
    }
    return id;
  }

  it('exports a conversation as NDJSON (info, every event in id order, state), read back through replay_json', async () => {
    const alice = await token('alice');
    const id = await conversationWith(alice, ['first', 'second', 'third']);
    const response = await fetch(`${app.url}/api/conversations/${id}/export`, {
      headers: { authorization: `Bearer ${alice}` },
    });
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
    const lines = ndjson(await response.text());
    const stored = await readAllEvents(app.url, alice, id);
    const info = (await api(app.url, 'GET', `/api/conversations/${id}`, { token: alice })).body;
    expect(lines[0]).toEqual(info);
    const events = lines.slice(1, -1) as StoredEvent[];
    expect(events).toEqual(stored);
    expect(events.map((event) => event.id)).toEqual(stored.map((_, index) => index));
    const state = (await api(app.url, 'GET', `/api/conversations/${id}/state`, { token: alice }))
      .body as { state: Record<string, unknown> };
    expect(lines[lines.length - 1]).toEqual({ state: state.state });

    // The events as replay_json: a new conversation with the same history.
    const replayed = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
      token: alice,
      body: { replay_json: JSON.stringify(events) },
    });
    expect(replayed.status).toBe(201);
    const copy = await readAllEvents(app.url, alice, replayed.body.conversation_id);
    expect(history(copy)).toEqual(history(events));
    expect(history(copy).length).toBeGreaterThanOrEqual(6);
  });

  it('exports through the SDK, line by line, and the same as REST', async () => {
    const bob = await token('bob');
    const id = await conversationWith(bob, ['one', 'two']);
    const client = createClient({ url: app.url, token: bob });
    const lines: ConversationExportLine[] = [];
    for await (const line of client.conversations.export(id)) lines.push(line);
    expect(lines.map((line) => line.kind)).toEqual([
      'conversation',
      ...Array.from({ length: lines.length - 2 }, () => 'event'),
      'state',
    ]);
    const rest = ndjson(
      await (
        await fetch(`${app.url}/api/conversations/${id}/export`, {
          headers: { authorization: `Bearer ${bob}` },
        })
      ).text(),
    );
    expect(
      lines.map((line) =>
        line.kind === 'conversation'
          ? line.conversation
          : line.kind === 'event'
            ? line.event
            : { state: line.state },
      ),
    ).toEqual(rest);
    // Another user's conversation does not exist for the caller.
    const carol = createClient({ url: app.url, token: await token('carol') });
    await expect(
      (async () => {
        for await (const line of carol.conversations.export(id)) void line;
      })(),
    ).rejects.toMatchObject({ code: 'NOT_FOUND', status: 404 });
  });

  it('answers an export of a conversation the caller cannot see with 404, and an admin reads it', async () => {
    const dave = await token('dave');
    const id = await conversationWith(dave, ['secret']);
    const stranger = await api(app.url, 'GET', `/api/conversations/${id}/export`, {
      token: await token('eve'),
    });
    expect(stranger.status).toBe(404);
    expect(stranger.body).toMatchObject({ error: { code: 'NOT_FOUND' } });
    const otherTenant = await api(app.url, 'GET', `/api/conversations/${id}/export`, {
      token: await devToken(app.url, { user_id: 'dave', tenant_id: uniqueName('t') }),
    });
    expect(otherTenant.status).toBe(404);
    const notUuid = await api(app.url, 'GET', '/api/conversations/nope/export', { token: dave });
    expect(notUuid.status).toBe(404);
    const admin = await fetch(`${app.url}/api/conversations/${id}/export`, {
      headers: { authorization: `Bearer ${await token('root', ['admin'])}` },
    });
    expect(admin.status).toBe(200);
    expect(ndjson(await admin.text()).length).toBeGreaterThan(2);
  });
});

void ConversationClient;
void metricTotals;
