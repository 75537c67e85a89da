import type { UserKeyEraser } from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import type { RedisConnection } from '../redis/redis-connections.js';

/**
 * An erasure's Redis side: every per-user key `ClusterKeys` builds (the
 * running set, the slot expiries, the rate-limit window; one hash tag, so
 * one DEL on a Redis Cluster) and every per-conversation key of a deleted
 * conversation (its tag). BullMQ keeps no job of a stopped conversation
 * (removed on completion), and channels hold nothing.
 */
export class RedisUserKeyEraser implements UserKeyEraser {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
  ) {}

  async forgetConversation(conversationId: string): Promise<void> {
    await this.redis.del(
      this.keys.conversationConnections(conversationId),
      this.keys.conversationFailovers(conversationId),
      this.keys.conversationStops(conversationId),
    );
  }

  async forgetUser(tenantId: string, userId: string): Promise<void> {
    await this.redis.del(
      this.keys.userRunning(tenantId, userId),
      this.keys.userSlotExpiry(tenantId, userId),
      this.keys.userActions(tenantId, userId),
    );
  }
}
