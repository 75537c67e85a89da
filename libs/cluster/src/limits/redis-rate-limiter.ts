import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { runScript } from '../redis/lua-scripts.js';

const WINDOW_MS = 60_000;

/** A slot taken in the user's window; cancelled when the action was not stored. */
export interface ActionReservation {
  cancel(): Promise<void>;
}

/**
 * `RATE_LIMIT_PER_MINUTE` across all gateways: a sliding log per user in a
 * sorted set, reserved by a Lua script before the action is stored.
 */
export class RedisUserActionRateLimiter {
  constructor(
    private readonly redis: Redis,
    private readonly keys: ClusterKeys,
    private readonly limitPerMinute: number,
  ) {}

  /** Reserves `count` actions at once (all or none). */
  async reserve(tenantId: string, userId: string, count = 1): Promise<ActionReservation | null> {
    if (this.limitPerMinute === 0) return { cancel: () => Promise.resolve() };
    const key = this.keys.userActions(tenantId, userId);
    const member = randomUUID();
    const reserved = (await runScript(
      this.redis,
      'reserve-action-1',
      [key],
      [this.limitPerMinute, WINDOW_MS, member, count],
    )) as number;
    if (reserved < 0) return null;
    const members = [member, ...Array.from({ length: count - 1 }, (_, i) => `${member}#${i + 2}`)];
    return {
      cancel: async () => {
        await this.redis.zrem(key, ...members);
      },
    };
  }
}
