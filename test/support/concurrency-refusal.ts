// One end-to-end scenario, run on the standalone app and on a cluster: under
// CONCURRENCY_POLICY=reject, what is refused with CONCURRENCY_LIMIT_REACHED
// leaves nothing stored, publishes nothing, and does not count against
// RATE_LIMIT_PER_MINUTE (docs/protocol.md); once a slot frees, the same request
// (the same conversation_id, the same idempotency key) is stored once and
// answered once. The metrics agree: each refusal is counted once in
// `cs_limit_rejections_total`, and `cs_user_actions_total` counts what
// RATE_LIMIT_PER_MINUTE counts.
import { randomUUID } from 'node:crypto';
import { expect } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, isAgentReply } from './clients.js';
import { metricGrowth, metricTotals } from './metrics.js';

/** The environment the scenario needs: one slot per user, `reject`, and this rate limit. */
export const REFUSAL_ENV = {
  MAX_CONCURRENT_CONVERSATIONS: '1',
  CONCURRENCY_POLICY: 'reject',
  // Exactly the user actions the scenario stores (creates and stops count): 2 + 1 + 2 + 2 + 2.
  RATE_LIMIT_PER_MINUTE: '9',
} as const;

/** How long a refused action is given to show up anyway (a publish crosses Redis in a cluster). */
const SETTLE_MS = 500;
/** What the scenario counts, on every process that serves `urls`. */
const COUNTERS = [
  'cs_limit_rejections_total',
  'cs_limit_evictions_total',
  'cs_user_actions_total',
] as const;

interface ErrorBody {
  error?: { code: string };
}

/**
 * Runs the scenario for one user through `urls` (the gateways, in turn; the
 * standalone app's one). `token` is the user's, with a budget of actions
 * untouched so far.
 */
export async function refusalStoresNothing(urls: readonly string[], token: string): Promise<void> {
  const url = (n: number) => urls[n % urls.length]!;
  const until = async (check: () => Promise<boolean>, what: string) => {
    const deadline = Date.now() + 15_000;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  };
  const eventsOf = async (id: string): Promise<StoredEvent[]> => {
    const all: StoredEvent[] = [];
    for (;;) {
      const page = await api<{ events: StoredEvent[]; has_more: boolean }>(
        url(0),
        'GET',
        `/api/conversations/${id}/events?start_id=${all.length}&limit=100`,
        { token },
      );
      expect(page.status).toBe(200);
      all.push(...page.body.events);
      if (!page.body.has_more) return all;
    }
  };
  const listed = async () => {
    const list = await api<{ results: Array<{ conversation_id: string }> }>(
      url(0),
      'GET',
      '/api/conversations?limit=100',
      { token },
    );
    expect(list.status).toBe(200);
    return list.body.results.map((r) => r.conversation_id).sort();
  };
  const userMessages = (events: readonly StoredEvent[]) =>
    events.filter((e) => e.source === 'user' && 'action' in e && e.action === 'message');
  /** Waits until each user message has an answer, then expects exactly one each. */
  const answeredOnce = async (id: string, count: number) => {
    await until(async () => {
      const events = await eventsOf(id);
      const sent = userMessages(events);
      return sent.length === count && sent.every((m) => events.some((e) => isAgentReply(e, m.id)));
    }, `the answers in ${id}`);
    const events = await eventsOf(id);
    for (const sent of userMessages(events)) {
      expect(events.filter((e) => isAgentReply(e, sent.id))).toHaveLength(1);
    }
    return events;
  };
  const create = (n: number, body: Record<string, unknown>) =>
    api<{ conversation_id: string; conversation_status: string } & ErrorBody>(
      url(n),
      'POST',
      '/api/conversations',
      { token, body },
    );
  const post = (n: number, id: string, content: string, key: string) =>
    api<{ event_id: number } & ErrorBody>(url(n), 'POST', `/api/conversations/${id}/events`, {
      token,
      body: { action: 'message', args: { content } },
      headers: { 'idempotency-key': key },
    });

  const countedBefore = await metricTotals(urls, COUNTERS);
  // The user's one slot, taken by a running conversation (2 actions); and a stopped one (1).
  const busy = await create(0, { initial_user_msg: 'one' });
  expect(busy.status, JSON.stringify(busy.body)).toBe(201);
  await answeredOnce(busy.body.conversation_id, 1);
  const stopped = await create(1, {});
  expect(stopped.status).toBe(201);
  const stoppedId = stopped.body.conversation_id;
  const before = await listed();
  // Watches the stopped conversation's room without starting it.
  const watcher = await ConversationClient.connect(url(1), token, {
    conversation_id: stoppedId,
    start: 'false',
  });
  try {
    // (a) A create whose first message would start a conversation: refused, nothing stored.
    const newId = randomUUID();
    for (let n = 0; n < 3; n += 1) {
      const refused = await create(n, { initial_user_msg: 'two', conversation_id: newId });
      expect([refused.status, refused.body.error?.code]).toEqual([
        429,
        'CONCURRENCY_LIMIT_REACHED',
      ]);
      const unnamed = await create(n, { initial_user_msg: 'two' });
      expect([unnamed.status, unnamed.body.error?.code]).toEqual([
        429,
        'CONCURRENCY_LIMIT_REACHED',
      ]);
    }
    expect(await listed()).toEqual(before);
    const lookup = await api(url(0), 'GET', `/api/conversations/${newId}`, { token });
    expect(lookup.status).toBe(404);

    // (b) A message that would start the stopped conversation: refused over REST and the socket.
    for (let n = 0; n < 2; n += 1) {
      const refused = await post(n, stoppedId, 'three', 'key-three');
      expect([refused.status, refused.body.error?.code]).toEqual([
        429,
        'CONCURRENCY_LIMIT_REACHED',
      ]);
      const ack = await watcher.message('four', 'key-four');
      expect(ack).toMatchObject({ ok: false, error: { code: 'CONCURRENCY_LIMIT_REACHED' } });
    }
    await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
    expect(await eventsOf(stoppedId)).toEqual([]);
    expect(watcher.stored).toEqual([]);
    const status = await api<{ status: string }>(url(0), 'GET', `/api/conversations/${stoppedId}`, {
      token,
    });
    expect(status.body.status).toBe('STOPPED');

    // A slot frees (a stop: 1 action): the same keys are stored once and answered once (2 actions).
    const freed = await api(
      url(0),
      'POST',
      `/api/conversations/${busy.body.conversation_id}/stop`,
      {
        token,
      },
    );
    expect(freed.status).toBe(200);
    const three = await post(1, stoppedId, 'three', 'key-three');
    expect(three.status, JSON.stringify(three.body)).toBe(201);
    const four = await watcher.message('four', 'key-four');
    expect(four.ok, JSON.stringify(four)).toBe(true);
    const repeat = await post(0, stoppedId, 'three', 'key-three');
    expect([repeat.status, repeat.body.event_id]).toEqual([200, three.body.event_id]);
    const answered = await answeredOnce(stoppedId, 2);
    expect(userMessages(answered).map((e) => e.id)).toEqual([
      three.body.event_id,
      four.ok ? four.event_id : -1,
    ]);

    // And the refused create, retried with its id once a slot frees (a stop and 2 actions).
    const stop = await api(url(1), 'POST', `/api/conversations/${stoppedId}/stop`, { token });
    expect(stop.status).toBe(200);
    const retried = await create(0, { initial_user_msg: 'two', conversation_id: newId });
    expect(retried.status, JSON.stringify(retried.body)).toBe(201);
    const created = await answeredOnce(newId, 1);
    expect(userMessages(created).map((e) => ('args' in e ? e.args['content'] : null))).toEqual([
      'two',
    ]);
    expect(await listed()).toEqual([...before, newId].sort());

    // (c) The refusals counted nothing: the 9 stored fill the limit, no more fits.
    const over = await post(1, newId, 'over', 'key-over');
    expect([over.status, over.body.error?.code]).toEqual([429, 'RATE_LIMITED']);

    // (d) Counted where decided, once each: the 10 refusals of (a) and (b), the 9 actions stored.
    expect(metricGrowth(countedBefore, await metricTotals(urls, COUNTERS))).toEqual({
      cs_limit_rejections_total: 10,
      cs_limit_evictions_total: 0,
      cs_user_actions_total: Number(REFUSAL_ENV.RATE_LIMIT_PER_MINUTE),
    });
  } finally {
    watcher.close();
  }
}
