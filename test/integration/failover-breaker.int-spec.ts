// FailoverBreaker on real Redis and Postgres: what a crashed holder was doing
// is read from the store, and only crashes on the same work within the
// window add up (record-failover-1.lua).
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ClusterKeys } from '@cs/cluster';
import { agentStateChangeDraft, type ConversationRef } from '@cs/core';
import type { OpenedStore } from '@cs/store';
import { FailoverBreaker } from '../../libs/cluster/src/leases/failover-breaker.js';
import { openScratchBackends, type ScratchBackends } from '../support/scratch-backends.js';
import { createEchoConversation, uniqueName } from '../support/services.js';

const MAX_FAILOVERS = 2;

describe(FailoverBreaker.name, () => {
  let backends: ScratchBackends;
  let opened: OpenedStore;
  let redis: Redis;
  let keys: ClusterKeys;

  beforeAll(async () => {
    backends = await openScratchBackends('cs_breaker', 'breaker-test');
    ({ opened, redis, keys } = backends);
  });

  afterEach(async () => {
    await backends.deleteKeys();
  });

  afterAll(async () => {
    await backends?.close();
  });

  const breaker = (windowMs = 60_000) =>
    new FailoverBreaker(redis, keys, opened.store, { maxFailovers: MAX_FAILOVERS, windowMs });

  async function conversation(): Promise<ConversationRef> {
    return createEchoConversation(opened.store, { tenantId: uniqueName('tenant'), userId: 'user' });
  }

  async function userSays(ref: ConversationRef, content: string): Promise<number> {
    const [stored] = await opened.store.append(ref.tenantId, ref.conversationId, [
      { source: 'user', body: { action: 'message', args: { content }, message: content } },
    ]);
    return stored!.event.id;
  }

  /** Stores an agent state change of a holder, answering `answers` when given. */
  async function agentState(
    ref: ConversationRef,
    state: 'loading' | 'awaiting_user_input',
    answers?: number,
  ): Promise<void> {
    const epoch = await opened.store.acquireLease(ref.tenantId, ref.conversationId, 'holder');
    await opened.store.append(
      ref.tenantId,
      ref.conversationId,
      [agentStateChangeDraft(state, answers === undefined ? {} : { cause: answers, answers })],
      { leaseEpoch: epoch },
    );
  }

  /** The outcome of each of `count` crashes in a row. */
  async function crashes(ref: ConversationRef, count: number, windowMs?: number) {
    const outcomes: boolean[] = [];
    for (let n = 0; n < count; n++) outcomes.push(await breaker(windowMs).tripsOnCrash(ref));
    return outcomes;
  }

  it('trips on the crash that makes more than maxFailovers on the same message', async () => {
    const ref = await conversation();
    await userSays(ref, 'boom');
    expect(await crashes(ref, MAX_FAILOVERS + 2)).toEqual([false, false, true, true]);
    const members = await redis.zrange(keys.conversationFailovers(ref.conversationId), '0', '-1');
    expect(members).toHaveLength(MAX_FAILOVERS + 2);
    expect(members.every((m) => m.startsWith('message:0|'))).toBe(true);
  });

  it('counts nothing for holders that crashed while the conversation sat idle', async () => {
    const ref = await conversation();
    expect(await crashes(ref, 3 * MAX_FAILOVERS)).toEqual(Array(3 * MAX_FAILOVERS).fill(false));
    // Answered messages leave it idle too.
    const sent = await userSays(ref, 'hello');
    await agentState(ref, 'awaiting_user_input', sent);
    expect(await crashes(ref, 3 * MAX_FAILOVERS)).toEqual(Array(3 * MAX_FAILOVERS).fill(false));
    expect(await redis.exists(keys.conversationFailovers(ref.conversationId))).toBe(0);
  });

  it('counts afresh on a message after the one the next holder answered', async () => {
    const ref = await conversation();
    const first = await userSays(ref, 'first');
    expect(await crashes(ref, MAX_FAILOVERS)).toEqual([false, false]);
    await agentState(ref, 'awaiting_user_input', first);
    await userSays(ref, 'second');
    expect(await crashes(ref, MAX_FAILOVERS + 1)).toEqual([false, false, true]);
  });

  it('counts crashes while loading against loading', async () => {
    const ref = await conversation();
    await agentState(ref, 'loading');
    expect(await crashes(ref, MAX_FAILOVERS + 1)).toEqual([false, false, true]);
  });

  it('forgets crashes older than the window, and the record expires with it', async () => {
    const ref = await conversation();
    await userSays(ref, 'boom');
    const key = keys.conversationFailovers(ref.conversationId);
    expect(await crashes(ref, MAX_FAILOVERS, 300)).toEqual([false, false]);
    expect(await redis.pttl(key)).toBeGreaterThan(0);
    expect(await redis.pttl(key)).toBeLessThanOrEqual(300);
    await new Promise((resolve) => setTimeout(resolve, 400));
    expect(await crashes(ref, MAX_FAILOVERS, 300)).toEqual([false, false]);
  });
});
