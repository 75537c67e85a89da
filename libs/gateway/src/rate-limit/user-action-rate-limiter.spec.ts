// The in-process limiter: the contract every limiter passes
// (test/integration/user-action-rate-limiter.contract.ts) on a clock of the
// test's own, and what only this one does.
import { describe, expect, it } from 'vitest';
import { userActionRateLimiterContract } from '../../../../test/integration/user-action-rate-limiter.contract.js';
import { InMemoryUserActionRateLimiter } from './user-action-rate-limiter.js';

userActionRateLimiterContract(InMemoryUserActionRateLimiter.name, () => {
  // One clock for the fixture's limiters: letting time pass for one user's
  // window lets it pass for all, and each case has users of its own.
  let now = 1_000_000;
  return Promise.resolve({
    createLimiter: (limitPerMinute) => new InMemoryUserActionRateLimiter(limitPerMinute, () => now),
    elapse(_owner, ms) {
      now += ms;
      return Promise.resolve();
    },
    teardown: () => Promise.resolve(),
  });
});

describe(InMemoryUserActionRateLimiter.name, () => {
  it('forgets users whose window is empty', async () => {
    let now = 0;
    const limiter = new InMemoryUserActionRateLimiter(5, () => now);
    for (let n = 0; n < 999; n++) await limiter.reserve('t', `user-${n}`);
    expect(limiter.trackedUsers).toBe(999);
    now = 120_000;
    await limiter.reserve('t', 'late');
    expect(limiter.trackedUsers).toBe(1);
  });

  it('says when the window will have room: once enough of its oldest have left', async () => {
    let now = 1_000;
    const limiter = new InMemoryUserActionRateLimiter(3, () => now);
    await limiter.reserve('t', 'a');
    now = 21_000;
    await limiter.reserve('t', 'a', 2);
    now = 31_000;
    // One more: the first leaves at 61,000.
    expect(await limiter.reserve('t', 'a')).toEqual({ reserved: false, retryAfterMs: 30_000 });
    // Two more: the pair of 21,000 must leave too, at 81,000.
    expect(await limiter.reserve('t', 'a', 2)).toEqual({ reserved: false, retryAfterMs: 50_000 });
    // More than the limit never fits.
    expect(await limiter.reserve('t', 'a', 4)).toEqual({ reserved: false, retryAfterMs: null });
    now = 61_000;
    expect(await limiter.reserve('t', 'a')).toMatchObject({ reserved: true });
  });

  it("forgets an erased user's window, and only that user's", async () => {
    const limiter = new InMemoryUserActionRateLimiter(1, () => 5);
    await limiter.reserve('t', 'a');
    await limiter.reserve('t', 'b');
    limiter.forget('t', 'a');
    expect(limiter.trackedUsers).toBe(1);
    expect(await limiter.reserve('t', 'a')).toMatchObject({ reserved: true });
    expect(await limiter.reserve('t', 'b')).toMatchObject({ reserved: false });
  });

  it('is off at 0', async () => {
    const limiter = new InMemoryUserActionRateLimiter(0);
    for (let n = 0; n < 100; n++)
      expect(await limiter.reserve('t', 'a')).toMatchObject({ reserved: true });
  });
});
