import type { RedisConnection } from '../redis/redis-connections.js';
import type { ConcurrencyPolicy } from '@cs/protocol';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { runScript } from '../redis/lua-scripts.js';

/** `held`: the conversation held the slot already (taking it again is a no-op). */
export type SlotResult = { granted: true; evicted?: string; held?: true } | { granted: false };

export interface HeldSlot {
  tenantId: string;
  userId: string;
  conversationId: string;
  /** Last activity (ms since epoch), or 0 to leave it unchanged. */
  lastActivity: number;
}

/**
 * `MAX_CONCURRENT_CONVERSATIONS` across the cluster: a per-user sorted set of
 * running conversations (scored by activity) and a hash of slot expiries,
 * changed only by Lua scripts so that concurrent starts on any gateway or
 * worker are atomic. Slots expire unless their holder renews them, so a
 * crashed process leaks none. Times come from Redis (`TIME`), not clients.
 */
export class UserConcurrencyLimiter {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly options: {
      limit: number;
      policy: ConcurrencyPolicy;
      /** How long a slot lives without renewal. */
      slotTtlMs: number;
    },
  ) {}

  get policy(): ConcurrencyPolicy {
    return this.options.policy;
  }

  async acquire(tenantId: string, userId: string, conversationId: string): Promise<SlotResult> {
    const result = await this.take(tenantId, userId, conversationId, this.options.policy);
    if (result[0] === 0) return { granted: false };
    if (result[0] === 3) return { granted: true, held: true };
    return result[0] === 2 && result[1] ? { granted: true, evicted: result[1] } : { granted: true };
  }

  /** Takes (or keeps) a slot only if one is free: never evicts, whatever the policy. */
  async reclaim(tenantId: string, userId: string, conversationId: string): Promise<boolean> {
    const [taken] = await this.take(tenantId, userId, conversationId, 'reject');
    return taken !== 0;
  }

  /** True while the conversation holds one of its user's slots. */
  async holds(tenantId: string, userId: string, conversationId: string): Promise<boolean> {
    const score = await this.redis.zscore(this.keys.userRunning(tenantId, userId), conversationId);
    return score !== null;
  }

  async release(tenantId: string, userId: string, conversationId: string): Promise<void> {
    await runScript(
      this.redis,
      'release-slot-2',
      [this.keys.userRunning(tenantId, userId), this.keys.userSlotExpiry(tenantId, userId)],
      [conversationId],
    );
  }

  /** Renews held slots, grouped by user; returns the conversations whose slot is gone. */
  async renew(slots: readonly HeldSlot[]): Promise<string[]> {
    const byUser = new Map<string, HeldSlot[]>();
    for (const slot of slots) {
      const key = this.keys.userRunning(slot.tenantId, slot.userId);
      byUser.set(key, [...(byUser.get(key) ?? []), slot]);
    }
    const lost = await Promise.all(
      [...byUser.values()].map(async (group) => {
        const { tenantId, userId } = group[0]!;
        const args: Array<string | number> = [this.options.slotTtlMs];
        for (const slot of group) args.push(slot.conversationId, Math.floor(slot.lastActivity));
        return (await runScript(
          this.redis,
          'renew-slots-2',
          [this.keys.userRunning(tenantId, userId), this.keys.userSlotExpiry(tenantId, userId)],
          args,
        )) as string[];
      }),
    );
    return lost.flat();
  }

  private async take(
    tenantId: string,
    userId: string,
    conversationId: string,
    policy: ConcurrencyPolicy,
  ): Promise<[number, string?]> {
    return (await runScript(
      this.redis,
      'acquire-slot-2',
      [this.keys.userRunning(tenantId, userId), this.keys.userSlotExpiry(tenantId, userId)],
      [conversationId, this.options.limit, policy, this.options.slotTtlMs],
    )) as [number, string?];
  }

  /** The user's conversations holding a slot. */
  running(tenantId: string, userId: string): Promise<string[]> {
    return this.redis.zrange(this.keys.userRunning(tenantId, userId), '0', '-1');
  }
}
