// The user slots contract against the cluster's UserConcurrencyLimiter on
// real Redis, under a key prefix of this file's own that is removed
// afterwards. A reservation is what the clustered manager makes of one
// (takeSlot): the slot itself, taken under `reject`, released by the id.
import { Redis } from 'ioredis';
import { ClusterKeys, UserConcurrencyLimiter } from '@cs/cluster';
import { ConcurrencyLimitError, HELD_SLOT } from '@cs/core';
import { deleteKeys, testRedisUrl, uniqueName } from '../support/services.js';
import { userSlotsContract } from './user-slots.contract.js';

userSlotsContract(UserConcurrencyLimiter.name, () => {
  const redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: 1 });
  const keys = new ClusterKeys(uniqueName('slots'));
  return Promise.resolve({
    create({ limit, policy }) {
      const limiter = new UserConcurrencyLimiter(redis, keys, { limit, policy, slotTtlMs: 60_000 });
      return {
        async start({ tenantId, userId, conversationId }) {
          const slot = await limiter.acquire(tenantId, userId, conversationId);
          if (!slot.granted) return { outcome: 'refused', evicted: [] };
          if (slot.held) return { outcome: 'held', evicted: [] };
          return { outcome: 'taken', evicted: slot.evicted === undefined ? [] : [slot.evicted] };
        },
        async reserve({ tenantId, userId, conversationId }) {
          const slot = await limiter.acquire(tenantId, userId, conversationId);
          if (!slot.granted) throw new ConcurrencyLimitError(limit);
          if (slot.held) return HELD_SLOT;
          return { taken: true, release: () => limiter.release(tenantId, userId, conversationId) };
        },
        async touch({ tenantId, userId, conversationId }, at) {
          await limiter.renew([{ tenantId, userId, conversationId, lastActivity: at }]);
        },
        stop: ({ tenantId, userId, conversationId }) =>
          limiter.release(tenantId, userId, conversationId),
        holders: ({ tenantId, userId }) => limiter.running(tenantId, userId),
      };
    },
    async teardown() {
      await deleteKeys(redis, keys.prefix);
      redis.disconnect();
    },
  });
});
