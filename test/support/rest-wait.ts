// The scenarios of waiting for an answer over REST (docs/protocol.md): run on
// a standalone app (rest-wait.e2e-spec.ts) and across the gateways and
// workers of a cluster (rest-wait-cluster.e2e-spec.ts).
import { expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { api } from './clients.js';
import { until } from './cluster.js';
import { metricSample } from './metrics.js';

async function created(url: string, token: string, body: Record<string, unknown> = {}) {
  const answer = await api(url, 'POST', '/api/conversations', { token, body });
  expect(answer.status, JSON.stringify(answer.body)).toBe(201);
  return answer.body.conversation_id as string;
}

function send(url: string, token: string, id: string, body: unknown, prefer?: string) {
  return api(url, 'POST', `/api/conversations/${id}/events`, {
    token,
    body,
    headers: prefer === undefined ? {} : { prefer },
  });
}

const message = (content: string, extra: Record<string, unknown> = {}) => ({
  action: 'message',
  args: { content },
  ...extra,
});

async function waitsOpen(url: string): Promise<number> {
  const text = (await api<string>(url, 'GET', '/metrics')).body;
  return metricSample(text, 'cs_rest_turn_waits') ?? -1;
}

export function waitScenarios(urls: () => [string, string], token: () => Promise<string>) {
  it('answers with the turn once it ended, and the turn reads the same on another gateway', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user);
    const answer = await send(first, user, id, message('hello'), 'wait=20');
    expect(answer.status, JSON.stringify(answer.body)).toBe(201);
    expect(answer.headers.get('preference-applied')).toBe('wait=20');
    const eventId = answer.body.event_id as number;
    const turn = answer.body.turn as { agent_state: string; events: StoredEvent[] };
    expect(turn.agent_state).toBe('awaiting_user_input');
    const contents = turn.events.flatMap((e) =>
      'action' in e && e.action === 'message' ? [e.args['content']] : [],
    );
    expect(contents).toEqual(['echo: hello']);
    expect(turn.events.every((e) => e.cause === eventId)).toBe(true);
    const ids = turn.events.map((e) => e.id);
    expect(ids).toEqual([...ids].sort((a, b) => a - b));

    const read = await api(second, 'GET', `/api/conversations/${id}/turns/${eventId}`, {
      token: user,
    });
    expect(read.status).toBe(200);
    expect(read.body).toEqual({
      status: 'completed',
      agent_state: 'awaiting_user_input',
      events: turn.events,
    });

    // A repeat waits for the same turn, and says so with 200.
    const again = await send(
      first,
      user,
      id,
      message('hello', { client_event_id: 'k1' }),
      'wait=5',
    );
    const repeat = await send(
      second,
      user,
      id,
      message('hello', { client_event_id: 'k1' }),
      'wait=5',
    );
    expect(repeat.status).toBe(200);
    expect(repeat.body.event_id).toBe(again.body.event_id);
    expect(repeat.body.turn.agent_state).toBe('awaiting_user_input');
  });

  it('answers null when the time is up first, and the turn reads as running', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'waiter' });
    const started = Date.now();
    const answer = await send(first, user, id, message('take your time'), 'wait=1');
    expect(answer.status).toBe(201);
    expect(answer.body.turn).toBeNull();
    expect(answer.headers.get('preference-applied')).toBe('wait=1');
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    const read = await api(
      second,
      'GET',
      `/api/conversations/${id}/turns/${answer.body.event_id}`,
      {
        token: user,
      },
    );
    expect(['pending', 'running']).toContain(read.body.status);
    await api(first, 'POST', `/api/conversations/${id}/stop`, { token: user, body: {} });
  });

  it('answers when the turn awaits confirmation', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'tool_user', confirmation_mode: true });
    const answer = await send(second, user, id, message('what time is it?'), 'wait=20');
    expect(answer.body.turn.agent_state).toBe('awaiting_user_confirmation');
    const read = await api(first, 'GET', `/api/conversations/${id}/turns/${answer.body.event_id}`, {
      token: user,
    });
    expect(read.body.status).toBe('awaiting_user_confirmation');
    expect(
      read.body.events.some((e: StoredEvent) => 'action' in e && e.action === 'tool_call'),
    ).toBe(true);
    // The answer's own wait ends at its state change; the message's turn then goes on.
    const confirmed = await send(
      first,
      user,
      id,
      { action: 'change_agent_state', args: { agent_state: 'user_confirmed' } },
      'wait=20',
    );
    expect(confirmed.body.turn.agent_state).toBe('user_confirmed');
    const path = `/api/conversations/${id}/turns/${answer.body.event_id}`;
    await until(
      async () => (await api(second, 'GET', path, { token: user })).body.status === 'completed',
      'the confirmed turn to complete',
    );
  });

  it('refuses a malformed or out-of-range wait naming Prefer, storing nothing', async () => {
    const [first] = urls();
    const user = await token();
    const id = await created(first, user);
    for (const prefer of ['wait=0', 'wait=121', 'wait=1.5', 'wait=soon', 'wait']) {
      const answer = await send(first, user, id, message('no'), prefer);
      expect(answer.status, prefer).toBe(400);
      expect(answer.body.error).toMatchObject({ code: 'BAD_REQUEST', field: 'Prefer' });
    }
    const info = await api(first, 'GET', `/api/conversations/${id}`, { token: user });
    expect(info.body.last_event_id).toBe(-1);
    // Other preferences are ignored: the plain answer.
    const plain = await send(first, user, id, message('yes'), 'respond-async, return=minimal');
    expect(plain.status).toBe(201);
    expect(plain.body).toEqual({ event_id: 0 });
    expect(plain.headers.get('preference-applied')).toBeNull();
  });

  it('keeps turns of other users and unknown events hidden', async () => {
    const [first] = urls();
    const user = await token();
    const stranger = await token();
    const id = await created(first, user);
    const answer = await send(first, user, id, message('mine'), 'wait=20');
    const path = `/api/conversations/${id}/turns/${answer.body.event_id}`;
    expect((await api(first, 'GET', path, { token: stranger })).status).toBe(404);
    expect(
      (
        await api(first, 'POST', `/api/conversations/${id}/events`, {
          token: stranger,
          body: message('theirs'),
          headers: { prefer: 'wait=5' },
        })
      ).status,
    ).toBe(404);
    // Not a user event, not stored, not a number.
    for (const eventId of ['1', '999', 'x']) {
      const read = await api(first, 'GET', `/api/conversations/${id}/turns/${eventId}`, {
        token: user,
      });
      expect(read.status, eventId).toBe(404);
    }
  });

  it('forgets a client that leaves while it waits', async () => {
    const [first] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'waiter' });
    const before = await waitsOpen(first);
    const leaving = new AbortController();
    const request = fetch(`${first}/api/conversations/${id}/events`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${user}`,
        'content-type': 'application/json',
        prefer: 'wait=60',
      },
      body: JSON.stringify(message('then leave')),
      signal: leaving.signal,
    }).catch(() => undefined);
    await until(async () => (await waitsOpen(first)) === before + 1, 'the wait to begin');
    leaving.abort();
    await request;
    await until(async () => (await waitsOpen(first)) === before, 'the wait to be forgotten', 2000);
    await api(first, 'POST', `/api/conversations/${id}/stop`, { token: user, body: {} });
  });
}
