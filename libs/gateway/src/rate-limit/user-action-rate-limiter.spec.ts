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
});
