import type {
  ClaimedWebhookDelivery,
  WebhookAttemptOutcome,
  WebhookAttemptRecord,
  WebhookClaimRequest,
  WebhookOutbox,
} from '@cs/core';
import { describe, expect, it } from 'vitest';
import {
  WebhookDispatcher,
  type WebhookDispatcherOptions,
  type WebhookOutcome,
} from './webhook-dispatcher.js';
import type { WebhookAttemptResult } from './webhook-request.js';

const URL_A = 'http://a.example/hook';

function claimed(id: string, attempts = 0, conversationId = 'c'): ClaimedWebhookDelivery {
  return {
    id,
    claim: `claim-${id}`,
    conversationId,
    endpointUrl: URL_A,
    seq: 1,
    tenantId: 't',
    userId: 'u',
    type: 'conversation.created',
    occurredAt: new Date(0),
    data: {},
    status: 'pending',
    attempts,
    lastError: null,
    createdAt: new Date(0),
    deliveredAt: null,
  };
}

/** A promise the test settles. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

/** An outbox that hands out what the test queues, and records what it is told. */
class ScriptedOutbox implements WebhookOutbox {
  readonly queue: ClaimedWebhookDelivery[] = [];
  readonly requests: WebhookClaimRequest[] = [];
  readonly recorded: { id: string; outcome: WebhookAttemptOutcome }[] = [];
  /** The ids of each `recordAttempts` call. */
  readonly writes: string[][] = [];
  /** Each write waits for it (then it is cleared); a throw makes the write fail. */
  holdNextWrite: Promise<void> | null = null;
  failNextWrite = false;
  syncEndpoints = () => Promise.resolve();
  claimDue(request: WebhookClaimRequest) {
    this.requests.push(request);
    return Promise.resolve(this.queue.splice(0, request.limit));
  }
  async recordAttempts(records: readonly WebhookAttemptRecord[]) {
    this.writes.push(records.map((record) => record.delivery.id));
    const hold = this.holdNextWrite;
    this.holdNextWrite = null;
    await hold;
    if (this.failNextWrite) {
      this.failNextWrite = false;
      throw new Error('connection lost');
    }
    return records.map(({ delivery, outcome }) => {
      this.recorded.push({ id: delivery.id, outcome });
      if (outcome.delivered) return 'delivered' as const;
      return outcome.retryAt === null ? ('failed' as const) : ('pending' as const);
    });
  }
  listDeliveries = () => Promise.resolve({ items: [], nextCursor: null });
  retryDelivery = () => Promise.resolve('not_found' as const);
  countPending = () => Promise.resolve(0);
}

/**
 * A dispatcher on one endpoint that never polls on its own (only wake-ups and
 * its own rounds make it claim), with the test's options on top.
 */
function quietDispatcher(
  outbox: WebhookOutbox,
  options: Partial<WebhookDispatcherOptions>,
): WebhookDispatcher {
  return new WebhookDispatcher(outbox, {
    endpoints: [{ url: URL_A, secret: 'whsec_x' }],
    timeoutMs: 1_000,
    maxAttempts: 3,
    pollIntervalMs: 60_000,
    ...options,
  });
}

async function settle(check: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !check(); i += 1) await new Promise((r) => setTimeout(r, 5));
  expect(check()).toBe(true);
}

describe(WebhookDispatcher.name, () => {
  it('sends what it claims, retries a failure later and fails it when its attempts are spent', async () => {
    const outbox = new ScriptedOutbox();
    const outcomes: WebhookOutcome[] = [];
    const results: Record<string, WebhookAttemptResult> = {
      ok: { ok: true },
      again: { ok: false, error: 'HTTP 500' },
      last: { ok: false, error: 'HTTP 500' },
    };
    const dispatcher = new WebhookDispatcher(outbox, {
      endpoints: [{ url: URL_A, secret: 'whsec_x' }],
      timeoutMs: 1_000,
      maxAttempts: 3,
      pollIntervalMs: 10_000,
      claimMarginMs: 500,
      now: () => 1_000_000,
      onOutcome: (outcome) => outcomes.push(outcome),
      post: (delivery) => Promise.resolve(results[delivery.id]!),
    });
    outbox.queue.push(claimed('ok'), claimed('again', 0), claimed('last', 2));
    dispatcher.start();
    await settle(() => outbox.recorded.length === 3);
    await dispatcher.stop();

    expect(outbox.requests[0]).toEqual({ endpointUrls: [URL_A], limit: 64, claimMs: 1_500 });
    const byId = Object.fromEntries(outbox.recorded.map((r) => [r.id, r.outcome]));
    expect(byId.ok).toEqual({ delivered: true });
    const again = byId.again as { retryAt: Date };
    // After the first failed attempt: 1 s, jittered down by at most a quarter.
    expect(again.retryAt.getTime() - 1_000_000).toBeGreaterThanOrEqual(750);
    expect(again.retryAt.getTime() - 1_000_000).toBeLessThanOrEqual(1_000);
    expect(byId.last).toEqual({ delivered: false, error: 'HTTP 500', retryAt: null });
    expect(outcomes.sort()).toEqual(['delivered', 'failed', 'retried']);
  });

  it('looks again as soon as it is woken, and not before without a wake-up', async () => {
    const outbox = new ScriptedOutbox();
    const dispatcher = quietDispatcher(outbox, {
      post: () => Promise.resolve({ ok: true }),
    });
    dispatcher.start();
    await settle(() => outbox.requests.length === 1);
    await new Promise((r) => setTimeout(r, 30));
    expect(outbox.requests).toHaveLength(1);
    outbox.queue.push(claimed('late'));
    dispatcher.wake();
    await settle(() => outbox.recorded.length === 1);
    await dispatcher.stop();
  });

  it('records the attempts that ended during a write in one write, and claims once for many wake-ups', async () => {
    const outbox = new ScriptedOutbox();
    const later = gate();
    const dispatcher = quietDispatcher(outbox, {
      // The first answers at once, the ten others when the test says.
      post: async (delivery) => {
        if (delivery.id !== 'first') await later.opened;
        return { ok: true };
      },
    });
    const held = gate();
    outbox.holdNextWrite = held.opened;
    outbox.queue.push(claimed('first'), ...Array.from({ length: 10 }, (_, i) => claimed(`d${i}`)));
    dispatcher.start();
    // The first outcome's write is under way: the ten end, and writes are hinted, meanwhile.
    await settle(() => outbox.writes.length === 1);
    later.open();
    for (let i = 0; i < 20; i += 1) dispatcher.wake();
    await new Promise((r) => setTimeout(r, 10));
    held.open();
    await settle(() => outbox.recorded.length === 11);
    await dispatcher.stop();

    expect(outbox.writes).toEqual([['first'], Array.from({ length: 10 }, (_, i) => `d${i}`)]);
    // At start, after the first write, after the second: not one per wake-up or attempt.
    expect(outbox.requests).toHaveLength(3);
  });

  it('claims from the conversations it was told of, and from those whose attempts it recorded', async () => {
    const outbox = new ScriptedOutbox();
    const dispatcher = quietDispatcher(outbox, { post: () => Promise.resolve({ ok: true }) });
    dispatcher.start();
    await settle(() => outbox.requests.length === 1);
    expect(outbox.requests[0]?.conversationIds).toBeUndefined();

    outbox.queue.push(claimed('one', 0, 'c1'));
    dispatcher.wake('c1');
    dispatcher.wake('c2');
    dispatcher.wake('c1');
    await settle(() => outbox.recorded.length === 1);
    // The delivery behind the one recorded is looked for in its conversation alone.
    await settle(() => outbox.requests.length === 3);
    await dispatcher.stop();
    expect(outbox.requests.slice(1).map((request) => request.conversationIds)).toEqual([
      ['c1', 'c2'],
      ['c1'],
    ]);
  });

  it('claims from every conversation once a poll interval has passed, even while hints keep it busy', async () => {
    const outbox = new ScriptedOutbox();
    let now = 0;
    const dispatcher = quietDispatcher(outbox, {
      pollIntervalMs: 1_000,
      now: () => now,
      post: () => Promise.resolve({ ok: true }),
    });
    dispatcher.start();
    await settle(() => outbox.requests.length === 1);
    dispatcher.wake('c1');
    await settle(() => outbox.requests.length === 2);
    now = 1_000;
    dispatcher.wake('c2');
    await settle(() => outbox.requests.length === 3);
    await dispatcher.stop();
    expect(outbox.requests.map((request) => request.conversationIds)).toEqual([
      undefined,
      ['c1'],
      undefined,
    ]);
  });

  it('claims again from the conversations of a full batch', async () => {
    const outbox = new ScriptedOutbox();
    const answer = gate();
    const dispatcher = quietDispatcher(outbox, {
      concurrency: 2,
      post: async () => {
        await answer.opened;
        return { ok: true };
      },
    });
    dispatcher.start();
    await settle(() => outbox.requests.length === 1);
    // Deliveries of c1 and c2 fill the batch (the scripted outbox ignores the filter).
    outbox.queue.push(claimed('a', 0, 'c1'), claimed('b', 0, 'c2'));
    dispatcher.wake('c3');
    await settle(() => outbox.requests.length === 2);
    answer.open();
    await settle(() => outbox.recorded.length === 2);
    await settle(() => outbox.requests.length === 3);
    await dispatcher.stop();
    // The full batch may have left some of c3's behind: c3 is claimed from again,
    // beside the conversations whose attempts were recorded.
    expect(outbox.requests[1]?.conversationIds).toEqual(['c3']);
    expect(outbox.requests[2]?.conversationIds?.slice().sort()).toEqual(['c1', 'c2', 'c3']);
  });

  it('leaves the claims of a write that failed to lapse, and goes on', async () => {
    const outbox = new ScriptedOutbox();
    const errors: string[] = [];
    const dispatcher = quietDispatcher(outbox, {
      onError: (message) => errors.push(message),
      post: () => Promise.resolve({ ok: true }),
    });
    outbox.failNextWrite = true;
    outbox.queue.push(claimed('lost'));
    dispatcher.start();
    await settle(() => errors.length === 1);
    outbox.queue.push(claimed('next'));
    dispatcher.wake();
    await settle(() => outbox.recorded.length === 1);
    await dispatcher.stop();
    expect(errors).toEqual(['could not record 1 webhook attempt(s)']);
    expect(outbox.recorded.map((r) => r.id)).toEqual(['next']);
  });

  it('records the attempts in flight before it stops, and claims nothing more', async () => {
    const outbox = new ScriptedOutbox();
    const answer = gate();
    const dispatcher = quietDispatcher(outbox, {
      post: async () => {
        await answer.opened;
        return { ok: true };
      },
    });
    outbox.queue.push(claimed('in-flight'));
    dispatcher.start();
    await settle(() => outbox.requests.length === 1);
    const stopped = dispatcher.stop();
    outbox.queue.push(claimed('not-sent'));
    answer.open();
    await stopped;
    expect(outbox.recorded.map((r) => r.id)).toEqual(['in-flight']);
    expect(outbox.requests).toHaveLength(1);
  });

  it('does nothing without endpoints', async () => {
    const outbox = new ScriptedOutbox();
    const dispatcher = new WebhookDispatcher(outbox, {
      endpoints: [],
      timeoutMs: 1,
      maxAttempts: 1,
    });
    expect(dispatcher.enabled).toBe(false);
    dispatcher.start();
    await dispatcher.stop();
    expect(outbox.requests).toEqual([]);
  });
});
