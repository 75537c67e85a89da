// The behaviour every UserActionRateLimiter must have (RATE_LIMIT_PER_MINUTE):
// the in-process one of the standalone app and the Redis one of a cluster run
// these same cases. Each runner supplies a fixture and calls
// `userActionRateLimiterContract`; the cases below know nothing of Redis.
//
// The window is a minute: rather than wait, a case asks the fixture to let
// time pass for one user's window (`elapse`). Redis reads its own clock, so
// the times a Redis limiter answers are checked within a margin.
import type { RateLimitRefusal, RateLimitReservation, UserActionRateLimiter } from '@cs/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';

export interface RateLimitOwner {
  tenantId: string;
  userId: string;
}

/** What an implementation provides to the contract. */
export interface UserActionRateLimiterFixture {
  /** A limiter of `limitPerMinute` actions (0: off); each case uses tenants of its own. */
  createLimiter(limitPerMinute: number): UserActionRateLimiter;
  /** As if `ms` passed for `owner`'s window: the actions it holds are that much older. */
  elapse(owner: RateLimitOwner, ms: number): Promise<void>;
  teardown(): Promise<void>;
}

/** How far a limiter's answer may be below the exact wait: the time the calls took. */
const MARGIN_MS = 1_000;

export function userActionRateLimiterContract(
  name: string,
  makeFixture: () => Promise<UserActionRateLimiterFixture>,
): void {
  describe(`UserActionRateLimiter contract: ${name}`, () => {
    let fixture: UserActionRateLimiterFixture;

    beforeAll(async () => {
      fixture = await makeFixture();
    });

    afterAll(async () => {
      await fixture?.teardown();
    });

    const newOwner = (): RateLimitOwner => ({ tenantId: uniqueName('tenant'), userId: 'alice' });

    function reserved(
      result: RateLimitReservation | RateLimitRefusal,
    ): asserts result is RateLimitReservation {
      expect(result).toMatchObject({ reserved: true });
    }

    /** A refusal whose wait is `ms`, less the time the calls took. */
    function expectRefusal(result: RateLimitReservation | RateLimitRefusal, ms: number): void {
      expect(result.reserved).toBe(false);
      const { retryAfterMs } = result as RateLimitRefusal;
      expect(retryAfterMs).toBeGreaterThan(ms - MARGIN_MS);
      expect(retryAfterMs).toBeLessThanOrEqual(ms);
    }

    it('reserves the limit in the window and refuses the next, per user and tenant', async () => {
      const limiter = fixture.createLimiter(2);
      const { tenantId } = newOwner();
      reserved(await limiter.reserve(tenantId, 'alice'));
      reserved(await limiter.reserve(tenantId, 'alice'));
      expectRefusal(await limiter.reserve(tenantId, 'alice'), 60_000);
      // Another user, and the same user name in another tenant, have windows of their own.
      reserved(await limiter.reserve(tenantId, 'bob'));
      reserved(await limiter.reserve(uniqueName('tenant'), 'alice'));
    });

    it('reserves several actions at once, all or none', async () => {
      const limiter = fixture.createLimiter(5);
      const { tenantId, userId } = newOwner();
      // More than the limit never fits.
      expect(await limiter.reserve(tenantId, userId, 6)).toEqual({
        reserved: false,
        retryAfterMs: null,
      });
      const four = await limiter.reserve(tenantId, userId, 4);
      reserved(four);
      // Two do not fit in the one left: neither is taken.
      expectRefusal(await limiter.reserve(tenantId, userId, 2), 60_000);
      reserved(await limiter.reserve(tenantId, userId));
      expectRefusal(await limiter.reserve(tenantId, userId), 60_000);
    });

    it('gives a cancelled reservation back, all of its actions, once', async () => {
      const limiter = fixture.createLimiter(4);
      const { tenantId, userId } = newOwner();
      const single = await limiter.reserve(tenantId, userId);
      const triple = await limiter.reserve(tenantId, userId, 3);
      reserved(single);
      reserved(triple);
      expectRefusal(await limiter.reserve(tenantId, userId), 60_000);
      await triple.cancel();
      // A second cancel gives back nothing more: `single` still holds its action.
      await triple.cancel();
      reserved(await limiter.reserve(tenantId, userId, 3));
      expectRefusal(await limiter.reserve(tenantId, userId), 60_000);
      await single.cancel();
      reserved(await limiter.reserve(tenantId, userId));
      expectRefusal(await limiter.reserve(tenantId, userId), 60_000);
    });

    it('frees each action once the window has passed it, and says when it will', async () => {
      const limiter = fixture.createLimiter(3);
      const owner = newOwner();
      const { tenantId, userId } = owner;
      reserved(await limiter.reserve(tenantId, userId));
      await fixture.elapse(owner, 20_000);
      reserved(await limiter.reserve(tenantId, userId, 2));
      await fixture.elapse(owner, 10_000);
      // One more: the first leaves the window 30 s from now.
      expectRefusal(await limiter.reserve(tenantId, userId), 30_000);
      // Two more: the pair must leave too, 50 s from now.
      expectRefusal(await limiter.reserve(tenantId, userId, 2), 50_000);
      await fixture.elapse(owner, 30_000);
      // The first has left; the pair has not.
      reserved(await limiter.reserve(tenantId, userId));
      expectRefusal(await limiter.reserve(tenantId, userId), 20_000);
      await fixture.elapse(owner, 60_000);
      reserved(await limiter.reserve(tenantId, userId, 3));
    });

    it('reserves exactly the limit when many reservations arrive at once', async () => {
      const limiter = fixture.createLimiter(7);
      const { tenantId, userId } = newOwner();
      const results = await Promise.all(
        Array.from({ length: 50 }, () => limiter.reserve(tenantId, userId)),
      );
      expect(results.filter((result) => result.reserved)).toHaveLength(7);
      expectRefusal(await limiter.reserve(tenantId, userId), 60_000);
    });

    it('reserves everything when the limit is 0 (off)', async () => {
      const limiter = fixture.createLimiter(0);
      const { tenantId, userId } = newOwner();
      for (let n = 0; n < 100; n += 1) reserved(await limiter.reserve(tenantId, userId));
      reserved(await limiter.reserve(tenantId, userId, 1_000));
    });
  });
}
