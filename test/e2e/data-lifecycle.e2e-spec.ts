// docs/protocol.md "Data lifecycle" and the export of "Branching", end to end on
// the built standalone app, on PGlite and on Postgres: a conversation's
// export (REST and SDK) read back through replay_json, the erasure of a user,
// retention with a short RETENTION_DAYS, the export of a user and the audit
// trail, with the access rules of each.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createClient, type ConversationExportLine } from '@cs/client';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, devToken, openSse } from '../support/clients.js';
import { readAllEvents, until } from '../support/cluster.js';
import { metricTotals } from '../support/metrics.js';
import { AGENT_MODULE } from '../support/agent-runtime.js';
import { ROOT, startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneBackends } from '../support/standalone-backends.js';

const backends = standaloneBackends('cs-lifecycle');

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
      AGENT_MODULES: AGENT_MODULE,
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

  it('replays the export of a rewound, edited and regenerated conversation exactly: ids, causes, undone marks, state, what its agent sees', async () => {
    const fiona = await token('fiona');
    const created = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
      token: fiona,
      body: { agent: 'history_teller' },
    });
    expect(created.status).toBe(201);
    const id = created.body.conversation_id;
    /** Waits until the turn of user message `cause` of `conversation` settled; gives its answer. */
    const settled = async (conversation: string, cause: number) => {
      let answer: StoredEvent | undefined;
      await until(async () => {
        const events = (await readAllEvents(app.url, fiona, conversation)).filter(
          (event) => event.undone_by === undefined && event.cause === cause,
        );
        answer = events.find((event) => 'action' in event && event.action === 'message');
        return events.some(
          (event) =>
            'observation' in event &&
            event.observation === 'agent_state_changed' &&
            event.extras['agent_state'] === 'awaiting_user_input',
        );
      }, `the settled turn of ${cause}`);
      return answer as StoredEvent & { args: { content: string } };
    };
    const say = async (conversation: string, content: string) => {
      const sent = await api<{ event_id: number }>(
        app.url,
        'POST',
        `/api/conversations/${conversation}/events`,
        { token: fiona, body: { action: 'message', args: { content } } },
      );
      expect(sent.status).toBe(201);
      return settled(conversation, sent.body.event_id);
    };
    const a = await say(id, 'set color=red');
    await say(id, 'set size=big');
    const c = await say(id, 'hello');
    const edit = await api<{ event_id: number }>(
      app.url,
      'POST',
      `/api/conversations/${id}/events/${c.cause}/edit`,
      { token: fiona, body: { content: 'set mood=ok' } },
    );
    expect(edit.status).toBe(201);
    await settled(id, edit.body.event_id);
    const regenerate = await api(app.url, 'POST', `/api/conversations/${id}/regenerate`, {
      token: fiona,
      body: {},
    });
    expect(regenerate.status).toBe(201);
    await settled(id, edit.body.event_id);
    const rewind = await api(app.url, 'POST', `/api/conversations/${id}/rewind`, {
      token: fiona,
      body: { to_event_id: a.id },
    });
    expect(rewind.status).toBe(200);
    await say(id, 'set shape=round');

    const response = await fetch(`${app.url}/api/conversations/${id}/export`, {
      headers: { authorization: `Bearer ${fiona}` },
    });
    const lines = ndjson(await response.text());
    const exported = lines.slice(1, -1) as StoredEvent[];
    expect(exported.filter((event) => event.undone_by !== undefined).length).toBeGreaterThan(6);
    /** A new conversation of the history teller with `replay` as replay_json. */
    const replay = async (replayed: unknown[]) => {
      const answer = await api<{ conversation_id: string }>(app.url, 'POST', '/api/conversations', {
        token: fiona,
        body: { agent: 'history_teller', replay_json: JSON.stringify(replayed) },
      });
      expect(answer.status, JSON.stringify(answer.body)).toBe(201);
      return answer.body.conversation_id;
    };
    /** An event as a history keeps it: all but when it was stored and its idempotency key. */
    const kept = (events: readonly StoredEvent[]) =>
      events.map((event) => {
        const {
          timestamp: _t,
          client_event_id: _k,
          ...rest
        } = event as StoredEvent & {
          client_event_id?: string;
        };
        return rest;
      });
    // The events alone, then with the `{ state }` line that ends the export.
    const eventsOnly = await replay(exported);
    expect(kept(await readAllEvents(app.url, fiona, eventsOnly))).toEqual(kept(exported));
    const copyId = await replay(lines.slice(1));
    expect(kept(await readAllEvents(app.url, fiona, copyId))).toEqual(kept(exported));
    const stateOf = async (conversation: string) =>
      (await api(app.url, 'GET', `/api/conversations/${conversation}/state`, { token: fiona }))
        .body as { state: Record<string, unknown>; agent_state: string };
    const [sourceState, copyState] = [await stateOf(id), await stateOf(copyId)];
    expect(copyState.state).toEqual({ color: 'red', shape: 'round' });
    expect(copyState.state).toEqual(sourceState.state);
    expect(copyState.agent_state).toBe('awaiting_user_input');
    // A turn a rewind undid is undone in the copy too.
    const undoneTurn = await api(app.url, 'GET', `/api/conversations/${copyId}/turns/${c.cause}`, {
      token: fiona,
    });
    expect(undoneTurn.body).toMatchObject({ status: 'undone' });

    // Both agents see the same history (no undone event) and the same state.
    const told = [await say(id, 'tell'), await say(copyId, 'tell')];
    expect(told.map((answer) => answer.args.content)).toEqual([
      'seen: set color=red | set shape=round | tell; state: {"color":"red","shape":"round"}',
      'seen: set color=red | set shape=round | tell; state: {"color":"red","shape":"round"}',
    ]);
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

  /** Polls the erasure until it is done; its last answer. */
  async function erasureDone(
    callerToken: string,
    erasureId: string,
  ): Promise<{ status: string; conversations_deleted: number }> {
    let last: { status: string; conversations_deleted: number } | undefined;
    await until(async () => {
      const answer = await api(app.url, 'GET', `/api/erasures/${erasureId}`, {
        token: callerToken,
      });
      expect(answer.status).toBe(200);
      last = answer.body;
      return last?.status === 'done';
    }, `erasure ${erasureId} done`);
    return last!;
  }

  it('erases a user: every conversation stopped and deleted with events and state, the user: state, its sockets closed', async () => {
    const frank = await token('frank');
    // A `user:` key, set by a tool of the agent.
    const stateful = await api(app.url, 'POST', '/api/conversations', {
      token: frank,
      body: {
        agent: 'tool_user',
        agent_config: { tool: 'set_state', arguments: { key: 'user:color', value: 'red' } },
        initial_user_msg: 'remember red',
      },
    });
    expect(stateful.status).toBe(201);
    await until(async () => {
      const state = await api(
        app.url,
        'GET',
        `/api/conversations/${stateful.body.conversation_id}/state`,
        {
          token: frank,
        },
      );
      return state.body.state?.['user:color'] === 'red';
    }, 'the user: state');
    // A turn running (the waiter streams until stopped), with a socket attached.
    const running = await api(app.url, 'POST', '/api/conversations', {
      token: frank,
      body: { agent: 'waiter', initial_user_msg: 'wait for it' },
    });
    const socket = await ConversationClient.connect(app.url, frank, {
      conversation_id: running.body.conversation_id,
      start: 'false',
    });
    await socket.waitFor((events) => events.some((event) => 'stream' in event), 10_000, 'a delta');
    const plain = await conversationWith(frank, ['hello']);
    // Another user's data stays.
    const grace = await token('grace');
    const kept = await conversationWith(grace, ['mine']);

    // Enough conversations that the erasure still runs when it is asked again.
    for (let n = 0; n < 30; n += 1) {
      const created = await api(app.url, 'POST', '/api/conversations', { token: frank, body: {} });
      expect(created.status).toBe(201);
    }
    const first = await api(app.url, 'DELETE', '/api/users/me', { token: frank });
    const again = await api(app.url, 'DELETE', '/api/users/frank', { token: frank });
    expect(first.status).toBe(202);
    expect(again.status).toBe(202);
    expect(first.body.erasure_id).toMatch(/^[0-9a-f-]{36}$/);
    expect(await erasureDone(frank, first.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 33,
    });
    // A second erasure of the same user while one runs is the same one; on
    // PGlite the first may be done already (the store suite checks the rule).
    if (again.body.erasure_id !== first.body.erasure_id) {
      expect(await erasureDone(frank, again.body.erasure_id)).toEqual({
        status: 'done',
        conversations_deleted: 0,
      });
    }
    await socket.waitFor(
      (events) =>
        events.some(
          (event) => 'status_update' in event && event.id === 'STATUS$CONVERSATION_DELETED',
        ),
      5_000,
      'the deletion notice',
    );
    await until(() => socket.socket.disconnected, 'the socket closed');
    for (const id of [stateful.body.conversation_id, running.body.conversation_id, plain]) {
      expect((await api(app.url, 'GET', `/api/conversations/${id}`, { token: frank })).status).toBe(
        404,
      );
    }
    expect(
      (await api(app.url, 'GET', '/api/conversations', { token: frank })).body.results,
    ).toEqual([]);
    const exported = ndjson(
      await (
        await fetch(`${app.url}/api/users/me/export`, {
          headers: { authorization: `Bearer ${frank}` },
        })
      ).text(),
    );
    expect(exported).toEqual([{ user_state: {} }]);
    expect((await api(app.url, 'GET', `/api/conversations/${kept}`, { token: grace })).status).toBe(
      200,
    );
  });

  it("closes every socket and stream of an erased admin, those on other users' conversations too", async () => {
    const quinn = await token('quinn');
    const theirs = await conversationWith(quinn, ['watched']);
    const root = await token('root', ['admin']);
    const socket = await ConversationClient.connect(app.url, root, {
      conversation_id: theirs,
      start: 'false',
    });
    const stream = await openSse(app.url, root, theirs);
    const ownerStream = await openSse(app.url, quinn, theirs);
    const ended = new Set<string>();
    void stream.ended.then(() => ended.add('admin'));
    void ownerStream.ended.then(() => ended.add('owner'));
    await until(
      () => stream.text().includes('"id":0') && ownerStream.text().includes('"id":0'),
      'the replays',
    );
    await socket.waitFor((events) => events.some((event) => 'id' in event && event.id === 0));

    const erased = await api(app.url, 'DELETE', '/api/users/me', { token: root });
    expect(erased.status).toBe(202);
    expect(await erasureDone(root, erased.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 0,
    });
    await until(() => ended.has('admin'), "the admin's stream ended");
    expect(stream.text()).toContain('STATUS$CONVERSATION_DELETED');
    await until(() => socket.socket.disconnected, "the admin's socket closed");
    // The owner's stream and conversation stay.
    expect(ended.has('owner')).toBe(false);
    expect(
      (await api(app.url, 'GET', `/api/conversations/${theirs}`, { token: quinn })).status,
    ).toBe(200);
    ownerStream.abort();
    socket.close();
  });

  it('answers 404 for an erasure or export of another user by a non-admin, and 202 with 0 for an unknown user', async () => {
    const henry = await token('henry');
    const mine = await conversationWith(henry, ['stay']);
    const ivy = await token('ivy');
    for (const [method, path] of [
      ['DELETE', '/api/users/henry'],
      ['GET', '/api/users/henry/export'],
      ['GET', '/api/audit'],
    ] as const) {
      const refused = await api(app.url, method, path, { token: ivy });
      expect(refused.status, `${method} ${path}`).toBe(404);
      expect(refused.body).toMatchObject({ error: { code: 'NOT_FOUND' } });
    }
    expect((await api(app.url, 'GET', `/api/conversations/${mine}`, { token: henry })).status).toBe(
      200,
    );
    // An admin of another tenant erases a user of its own tenant of that name: nothing here.
    const outsider = await devToken(app.url, {
      user_id: 'root',
      tenant_id: uniqueName('t'),
      roles: ['admin'],
    });
    const elsewhere = await api(app.url, 'DELETE', '/api/users/henry', { token: outsider });
    expect(elsewhere.status).toBe(202);
    expect(await erasureDone(outsider, elsewhere.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 0,
    });
    expect((await api(app.url, 'GET', `/api/conversations/${mine}`, { token: henry })).status).toBe(
      200,
    );
    // Its erasure does not exist for this tenant.
    expect(
      (await api(app.url, 'GET', `/api/erasures/${elsewhere.body.erasure_id}`, { token: henry }))
        .status,
    ).toBe(404);
    expect((await api(app.url, 'GET', '/api/erasures/not-a-uuid', { token: henry })).status).toBe(
      404,
    );
    // An admin of the tenant, of a user never seen: 202, done with 0.
    const admin = await token('root', ['admin']);
    const unknown = await api(app.url, 'DELETE', `/api/users/${uniqueName('nobody')}`, {
      token: admin,
    });
    expect(unknown.status).toBe(202);
    expect(await erasureDone(admin, unknown.body.erasure_id)).toEqual({
      status: 'done',
      conversations_deleted: 0,
    });
  });

  it("exports a user's conversations then its user: state, for the user and for an admin", async () => {
    const jack = await token('jack');
    const stateful = await api(app.url, 'POST', '/api/conversations', {
      token: jack,
      body: {
        agent: 'tool_user',
        agent_config: { tool: 'set_state', arguments: { key: 'user:lang', value: 'fr' } },
        initial_user_msg: 'remember fr',
      },
    });
    await until(async () => {
      const state = await api(
        app.url,
        'GET',
        `/api/conversations/${stateful.body.conversation_id}/state`,
        {
          token: jack,
        },
      );
      return (
        state.body.state?.['user:lang'] === 'fr' && state.body.agent_state === 'awaiting_user_input'
      );
    }, 'the user: state');
    const second = await conversationWith(jack, ['a', 'b']);
    const ids = [stateful.body.conversation_id as string, second].sort();
    for (const caller of [jack, await token('root', ['admin'])]) {
      const response = await fetch(`${app.url}/api/users/jack/export`, {
        headers: { authorization: `Bearer ${caller}` },
      });
      expect(response.status).toBe(200);
      expect(response.headers.get('content-type')).toMatch(/^application\/x-ndjson/);
      const lines = ndjson(await response.text()) as Array<Record<string, unknown>>;
      const starts = lines.flatMap((line, index) => ('conversation_id' in line ? [index] : []));
      expect(starts.map((index) => lines[index]!['conversation_id'])).toEqual(ids);
      // Each conversation as its own export: info, events, state.
      for (const [n, start] of starts.entries()) {
        const end = starts[n + 1] ?? lines.length - 1;
        const one = ndjson(
          await (
            await fetch(`${app.url}/api/conversations/${ids[n]}/export`, {
              headers: { authorization: `Bearer ${jack}` },
            })
          ).text(),
        );
        expect(lines.slice(start, end)).toEqual(one);
      }
      expect(lines[lines.length - 1]).toEqual({ user_state: { 'user:lang': 'fr' } });
    }
  });

  it("keeps an audit trail of erasures, exports and deletes of other users' conversations, for admins", async () => {
    const admin = await token('auditor', ['admin']);
    const kate = await token('kate');
    const doomed = await conversationWith(kate, ['bye']);
    expect(
      (await api(app.url, 'DELETE', `/api/conversations/${doomed}`, { token: admin })).status,
    ).toBe(204);
    await (
      await fetch(`${app.url}/api/users/kate/export`, {
        headers: { authorization: `Bearer ${admin}` },
      })
    ).text();
    // Her own delete and export of herself are hers: the delete is not audited.
    const own = await conversationWith(kate, ['mine']);
    expect(
      (await api(app.url, 'DELETE', `/api/conversations/${own}`, { token: kate })).status,
    ).toBe(204);
    const page = await api(app.url, 'GET', '/api/audit?limit=100', { token: admin });
    expect(page.status).toBe(200);
    const records = page.body.results as Array<{
      id: string;
      time: string;
      actor: string;
      action: string;
      target: string;
    }>;
    expect(records).toEqual(
      expect.arrayContaining([
        expect.objectContaining({
          actor: 'auditor',
          action: 'conversation.delete',
          target: `conversation:${doomed}`,
        }),
        expect.objectContaining({ actor: 'auditor', action: 'user.export', target: 'user:kate' }),
      ]),
    );
    expect(records.some((record) => record.target === `conversation:${own}`)).toBe(false);
    expect(records.some((record) => record.action === 'user.erase')).toBe(true);
    // Newest first, paged.
    const ids = records.map((record) => Number(record.id));
    expect(ids).toEqual([...ids].sort((a, b) => b - a));
    const first = await api(app.url, 'GET', '/api/audit?limit=1', { token: admin });
    expect(first.body.results).toHaveLength(1);
    expect(first.body.next_page_id).toEqual(expect.any(String));
    const next = await api(
      app.url,
      'GET',
      `/api/audit?limit=1&page_id=${first.body.next_page_id}`,
      {
        token: admin,
      },
    );
    expect(next.body.results[0].id).toBe(records[1]!.id);
    expect((await api(app.url, 'GET', '/api/audit?page_id=zz', { token: admin })).status).toBe(400);
    expect((await api(app.url, 'GET', '/api/audit?limit=0', { token: admin })).status).toBe(400);
  });
});

/** RETENTION_DAYS as a decimal: 0.00003 days is 2.592 s. */
const RETENTION_DAYS = '0.00003';
const RETENTION_MS = 0.00003 * 86_400_000;

describe.each(backends)('retention on the standalone app ($name)', (backend) => {
  let app: AppProcess;
  let cleanup: () => Promise<void>;
  const tenant = uniqueName('tenant');

  beforeAll(async () => {
    const prepared = await backend.env();
    cleanup = prepared.cleanup;
    app = await startApp('standalone', {
      ...prepared.env,
      AUTH_DEV_TOKENS: 'true',
      RATE_LIMIT_PER_MINUTE: '0',
      RETENTION_DAYS,
      RETENTION_SWEEP_INTERVAL_MS: '250',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await cleanup?.();
  });

  it('deletes a conversation idle for RETENTION_DAYS, closing its sockets, and keeps an active one', async () => {
    const token = await devToken(app.url, { user_id: 'lena', tenant_id: tenant });
    const create = async () => {
      const created = await api(app.url, 'POST', '/api/conversations', { token, body: {} });
      expect(created.status).toBe(201);
      return created.body.conversation_id as string;
    };
    // Read before the create: the conversation's activity time is stamped
    // within the request, so this is never later than it, however slow the answer.
    const createdAt = Date.now();
    const idle = await create();
    const active = await create();
    const socket = await ConversationClient.connect(app.url, token, {
      conversation_id: idle,
      start: 'false',
    });
    const before = await metricTotals([app.url], ['cs_retention_deleted_total']);
    // The active one gets a message every 400 ms (the echo agent answers each).
    let n = 0;
    const keepAlive = setInterval(() => {
      void api(app.url, 'POST', `/api/conversations/${active}/events`, {
        token,
        body: { action: 'message', args: { content: `still here ${(n += 1)}` } },
      });
    }, 400);
    try {
      await until(
        async () =>
          (await api(app.url, 'GET', `/api/conversations/${idle}`, { token })).status === 404,
        'the idle conversation deleted',
        20_000,
        100,
      );
      // Not before its time (the sweep's search compares activity times).
      expect(Date.now() - createdAt).toBeGreaterThanOrEqual(RETENTION_MS - 100);
      await socket.waitFor(
        (events) =>
          events.some(
            (event) => 'status_update' in event && event.id === 'STATUS$CONVERSATION_DELETED',
          ),
        5_000,
        'the deletion notice',
      );
      await until(() => socket.socket.disconnected, 'the socket closed');
      // Twice its retention later, the active one is still there.
      await until(() => Date.now() - createdAt > 2 * RETENTION_MS, 'twice the retention', 10_000);
      expect((await api(app.url, 'GET', `/api/conversations/${active}`, { token })).status).toBe(
        200,
      );
    } finally {
      clearInterval(keepAlive);
      socket.close();
    }
    const after = await metricTotals([app.url], ['cs_retention_deleted_total']);
    expect(
      after.cs_retention_deleted_total - before.cs_retention_deleted_total,
    ).toBeGreaterThanOrEqual(1);
    // Left alone, it goes too.
    await until(
      async () =>
        (await api(app.url, 'GET', `/api/conversations/${active}`, { token })).status === 404,
      'the conversation left alone deleted',
      20_000,
      100,
    );
  });
});

describe('RETENTION_DAYS at start', () => {
  it.each(['-1', 'abc'])(
    'refuses to start with RETENTION_DAYS=%s, in one line naming it',
    (value) => {
      const dir = mkdtempSync(join(tmpdir(), 'cs-lifecycle-'));
      try {
        const run = spawnSync(process.execPath, ['dist/apps/standalone/src/main.js'], {
          cwd: ROOT,
          env: { ...process.env, DATA_DIR: dir, RETENTION_DAYS: value, PORT: '0' },
          encoding: 'utf8',
          timeout: 60_000,
        });
        expect(run.status).not.toBe(0);
        const problems = run.stderr.split('\n').filter((line) => line.startsWith('  - '));
        expect(problems).toHaveLength(1);
        expect(problems[0]).toMatch(/^ {2}- RETENTION_DAYS: /);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
