import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { AgentSession, ConversationRef } from '@cs/core';
import {
  CATCH_UP_INTERVAL_MS,
  HURRIED_CATCH_UP_INTERVAL_MS,
  HURRIED_CATCH_UP_WINDOW_MS,
  LostWakeUpCatchUp,
} from './catch-up.js';
import type { HostedConversation } from './hosted-conversation.js';

/**
 * One hosted session behind by one event (its wake-up was lost), over a
 * store whose reads are counted and may be held.
 */
function fixture() {
  const ref: ConversationRef = {
    tenantId: 't',
    userId: 'u',
    conversationId: 'c-1',
    incarnation: 'i1',
  };
  const state = { reads: 0, wakes: 0, release: null as (() => void) | null };
  const session = {
    isClosed: false,
    wantsRetry: false,
    lastEventId: 4,
    wake: () => (state.wakes += 1),
  } as unknown as AgentSession;
  const hosted: HostedConversation = {
    ref,
    session,
    epoch: 1,
    handOff: false,
    pending: null,
    leaseLost: false,
  };
  let held = false;
  const catchUp = new LostWakeUpCatchUp(
    {
      lastEventIds: async () => {
        state.reads += 1;
        if (held) await new Promise<void>((resolve) => (state.release = resolve));
        return new Map([[ref.conversationId, 5]]);
      },
    },
    () => [hosted],
    () => undefined,
  );
  return { catchUp, state, hold: (on: boolean) => (held = on) };
}

describe(LostWakeUpCatchUp.name, () => {
  beforeEach(() => void vi.useFakeTimers());
  afterEach(() => void vi.useRealTimers());

  it('checks every few seconds, and every quarter second for a while after a sign that wake-ups are lost', async () => {
    const { catchUp, state } = fixture();
    catchUp.start();
    await vi.advanceTimersByTimeAsync(CATCH_UP_INTERVAL_MS - 1);
    expect(state.reads).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    expect(state).toMatchObject({ reads: 1, wakes: 1 });

    catchUp.hurry();
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_INTERVAL_MS);
    expect(state).toMatchObject({ reads: 2, wakes: 2 });
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_INTERVAL_MS);
    expect(state.reads).toBe(3);

    // A further sign extends the window from then; once it is over, the regular pace again.
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_WINDOW_MS / 2);
    catchUp.hurry();
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_WINDOW_MS + HURRIED_CATCH_UP_INTERVAL_MS);
    const afterWindow = state.reads;
    expect(afterWindow).toBeGreaterThan(
      3 + HURRIED_CATCH_UP_WINDOW_MS / HURRIED_CATCH_UP_INTERVAL_MS,
    );
    await vi.advanceTimersByTimeAsync(CATCH_UP_INTERVAL_MS);
    expect(state.reads).toBe(afterWindow + 1);
    catchUp.stop();
  });

  it('runs one pass at a time, and does not hurry once stopped', async () => {
    const { catchUp, state, hold } = fixture();
    hold(true);
    catchUp.hurry();
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_INTERVAL_MS * 4);
    // The first read has not answered: the later ticks joined it.
    expect(state.reads).toBe(1);
    hold(false);
    state.release?.();
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_INTERVAL_MS);
    expect(state.reads).toBe(2);

    catchUp.stop();
    catchUp.hurry();
    await vi.advanceTimersByTimeAsync(HURRIED_CATCH_UP_WINDOW_MS);
    expect(state.reads).toBe(2);
  });
});
