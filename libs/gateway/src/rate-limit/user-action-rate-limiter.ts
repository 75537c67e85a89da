import {
  RATE_LIMIT_WINDOW_MS,
  UNLIMITED,
  type RateLimitRefusal,
  type RateLimitReservation,
  type UserActionRateLimiter,
} from '@cs/core';

/** The in-process limiter of the standalone mode: a sliding log per user. */
export class InMemoryUserActionRateLimiter implements UserActionRateLimiter {
  private readonly windows = new Map<string, number[]>();
  private reservations = 0;

  constructor(
    private readonly limitPerMinute: number,
    private readonly now: () => number = Date.now,
  ) {}

  reserve(
    tenantId: string,
    userId: string,
    count = 1,
  ): Promise<RateLimitReservation | RateLimitRefusal> {
    if (this.limitPerMinute === 0) return Promise.resolve(UNLIMITED);
    const key = JSON.stringify([tenantId, userId]);
    const now = this.now();
    if (++this.reservations % SWEEP_EVERY === 0) this.sweep(now);
    const log = (this.windows.get(key) ?? []).filter((t) => t > now - RATE_LIMIT_WINDOW_MS);
    if (log.length + count > this.limitPerMinute) {
      this.windows.set(key, log);
      return Promise.resolve({
        reserved: false,
        retryAfterMs: retryAfterMs(log, count, this.limitPerMinute, now),
      });
    }
    for (let i = 0; i < count; i += 1) log.push(now);
    this.windows.set(key, log);
    let cancelled = false;
    return Promise.resolve({
      reserved: true,
      cancel: () => {
        // Once: a second cancel would free actions of other reservations made in the same ms.
        if (cancelled) return Promise.resolve();
        cancelled = true;
        const current = this.windows.get(key);
        for (let i = 0; i < count; i += 1) {
          const index = current?.lastIndexOf(now) ?? -1;
          if (current && index >= 0) current.splice(index, 1);
        }
        return Promise.resolve();
      },
    });
  }

  /** Forgets users with nothing left in their window, so the map does not grow forever. */
  private sweep(now: number): void {
    for (const [key, log] of this.windows) {
      if (log.every((t) => t <= now - RATE_LIMIT_WINDOW_MS)) this.windows.delete(key);
    }
  }

  /** Users with actions in their current window (for tests and metrics). */
  get trackedUsers(): number {
    return this.windows.size;
  }
}

const SWEEP_EVERY = 1000;

/**
 * How long until `count` more actions fit a window of `limit` whose log
 * (times in ms, oldest first) is `log`: until enough of its oldest have left.
 */
function retryAfterMs(
  log: readonly number[],
  count: number,
  limit: number,
  now: number,
): number | null {
  if (count > limit) return null;
  const leaving = log[log.length + count - limit - 1];
  return leaving === undefined ? 0 : Math.max(0, leaving + RATE_LIMIT_WINDOW_MS - now);
}
