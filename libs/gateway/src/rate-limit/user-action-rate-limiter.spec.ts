import { describe, expect, it } from 'vitest';
import { InMemoryUserActionRateLimiter } from './user-action-rate-limiter.js';

describe(InMemoryUserActionRateLimiter.name, () => {
  it('allows the limit in any 60 s window, per user', async () => {
    let now = 0;
    const limiter = new InMemoryUserActionRateLimiter(2, () => now);
    expect(await limiter.reserve('t', 'a')).not.toBeNull();
    now = 30_000;
    expect(await limiter.reserve('t', 'a')).not.toBeNull();
    expect(await limiter.reserve('t', 'a')).toBeNull();
    expect(await limiter.reserve('t', 'b')).not.toBeNull();
    expect(await limiter.reserve('other', 'a')).not.toBeNull();
    now = 60_001; // the first reservation left the window
    expect(await limiter.reserve('t', 'a')).not.toBeNull();
    expect(await limiter.reserve('t', 'a')).toBeNull();
  });

  it('gives a cancelled reservation back', async () => {
    const limiter = new InMemoryUserActionRateLimiter(1, () => 5);
    const reservation = await limiter.reserve('t', 'a');
    await reservation!.cancel();
    expect(await limiter.reserve('t', 'a')).not.toBeNull();
    expect(await limiter.reserve('t', 'a')).toBeNull();
  });

  it('reserves several actions at once, all or none', async () => {
    const limiter = new InMemoryUserActionRateLimiter(5, () => 5);
    expect(await limiter.reserve('t', 'a', 6)).toBeNull();
    const four = await limiter.reserve('t', 'a', 4);
    expect(four).not.toBeNull();
    expect(await limiter.reserve('t', 'a', 2)).toBeNull();
    await four!.cancel();
    expect(await limiter.reserve('t', 'a', 5)).not.toBeNull();
    expect(await limiter.reserve('t', 'a')).toBeNull();
  });

  it('forgets users whose window is empty', async () => {
    let now = 0;
    const limiter = new InMemoryUserActionRateLimiter(5, () => now);
    for (let n = 0; n < 999; n++) await limiter.reserve('t', `user-${n}`);
    expect(limiter.trackedUsers).toBe(999);
    now = 120_000;
    await limiter.reserve('t', 'late');
    expect(limiter.trackedUsers).toBe(1);
  });

  it('is off at 0', async () => {
    const limiter = new InMemoryUserActionRateLimiter(0);
    for (let n = 0; n < 100; n++) expect(await limiter.reserve('t', 'a')).not.toBeNull();
  });
});
