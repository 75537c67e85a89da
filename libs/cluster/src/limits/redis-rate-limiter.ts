import { randomUUID } from 'node:crypto';
import type { RedisConnection } from '../redis/redis-connections.js';
import {
  RATE_LIMIT_WINDOW_MS,
  UNLIMITED,
  type RateLimitRefusal,
  type RateLimitReservation,
  type UserActionRateLimiter,
} from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { runScript } from '../redis/lua-scripts.js';

/**
 * `RATE_LIMIT_PER_MINUTE` across all gateways: a sliding log per user in a
 * sorted set, reserved by a Lua script before the action is stored.
 */
export class RedisUserActionRateLimiter implements UserActionRateLimiter {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly limitPerMinute: number,
  ) {}

  /** Reserves `count` actions at once (all or none). */
  async reserve(
    tenantId: string,
    userId: string,
    count = 1,
  ): Promise<RateLimitReservation | RateLimitRefusal> {
    if (this.limitPerMinute === 0) return UNLIMITED;
    const key = this.keys.userActions(tenantId, userId);
    const member = randomUUID();
    const reserved = (await runScript(
      this.redis,
      'reserve-action-1',
      [key],
      [this.limitPerMinute, RATE_LIMIT_WINDOW_MS, member, count],
    )) as number;
    // -1: never; below it, -1 - the ms until the window has room.
    if (reserved < 0)
      return { reserved: false, retryAfterMs: reserved === -1 ? null : -1 - reserved };
    const members = [member, ...Array.from({ length: count - 1 }, (_, i) => `${member}#${i + 2}`)];
    return {
      reserved: true,
      cancel: async () => {
        await this.redis.zrem(key, ...members);
      },
    };
  }
}
