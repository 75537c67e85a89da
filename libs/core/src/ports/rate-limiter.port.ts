/**
 * `RATE_LIMIT_PER_MINUTE`: the port both limiters implement (in process for
 * the standalone mode, in Redis for a cluster).
 */

export const RATE_LIMIT_WINDOW_MS = 60_000;

/** A slot taken in the user's window; cancelled when the action was not stored. */
export interface RateLimitReservation {
  reserved: true;
  cancel(): Promise<void>;
}

/** The window had no room: when it will (null when never: more actions than the limit). */
export interface RateLimitRefusal {
  reserved: false;
  retryAfterMs: number | null;
}

/**
 * At most `RATE_LIMIT_PER_MINUTE` stored user actions per user in any 60 s
 * window. A caller reserves a slot before storing and cancels it when the
 * action turned out to be an idempotent repeat or was refused.
 */
export interface UserActionRateLimiter {
  /** Reserves `count` actions (default 1), all or none. */
  reserve(
    tenantId: string,
    userId: string,
    count?: number,
  ): Promise<RateLimitReservation | RateLimitRefusal>;
}

/** What every limiter answers when the limit is off. */
export const UNLIMITED: RateLimitReservation = { reserved: true, cancel: () => Promise.resolve() };
