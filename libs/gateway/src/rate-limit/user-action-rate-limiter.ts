/** A slot taken in the user's window; cancelled when the action was not stored. */
export interface RateLimitReservation {
  cancel(): Promise<void>;
}

/**
 * At most `RATE_LIMIT_PER_MINUTE` stored user actions per user in any 60 s
 * window. A caller reserves a slot before storing and cancels it when the
 * action turned out to be an idempotent repeat or was refused.
 */
export interface UserActionRateLimiter {
  /** Reserves `count` actions (default 1), all or none; null when the window has no room. */
  reserve(tenantId: string, userId: string, count?: number): Promise<RateLimitReservation | null>;
}

export const RATE_LIMIT_WINDOW_MS = 60_000;

/** The in-process limiter of the standalone mode: a sliding log per user. */
export class InMemoryUserActionRateLimiter implements UserActionRateLimiter {
  private readonly windows = new Map<string, number[]>();
  private reservations = 0;

  constructor(
    private readonly limitPerMinute: number,
    private readonly now: () => number = Date.now,
  ) {}

  reserve(tenantId: string, userId: string, count = 1): Promise<RateLimitReservation | null> {
    if (this.limitPerMinute === 0) return Promise.resolve({ cancel: () => Promise.resolve() });
    const key = JSON.stringify([tenantId, userId]);
    const now = this.now();
    if (++this.reservations % SWEEP_EVERY === 0) this.sweep(now);
    const log = (this.windows.get(key) ?? []).filter((t) => t > now - RATE_LIMIT_WINDOW_MS);
    if (log.length + count > this.limitPerMinute) {
      this.windows.set(key, log);
      return Promise.resolve(null);
    }
    for (let i = 0; i < count; i += 1) log.push(now);
    this.windows.set(key, log);
    return Promise.resolve({
      cancel: () => {
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
