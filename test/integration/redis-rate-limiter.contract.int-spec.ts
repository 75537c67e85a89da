// The UserActionRateLimiter contract against the cluster's limiter on real
// Redis, under a key prefix of this file's own that is removed afterwards.
import { Redis } from 'ioredis';
import { ClusterKeys, RedisUserActionRateLimiter } from '@cs/cluster';
import { deleteKeys, testRedisUrl, uniqueName } from '../support/services.js';
import { userActionRateLimiterContract } from './user-action-rate-limiter.contract.js';

userActionRateLimiterContract(RedisUserActionRateLimiter.name, () => {
  const redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: 1 });
  const keys = new ClusterKeys(uniqueName('rate'));
  return Promise.resolve({
    createLimiter: (limitPerMinute) => new RedisUserActionRateLimiter(redis, keys, limitPerMinute),
    // The log's scores are the times its actions were reserved at (Redis' clock).
    async elapse({ tenantId, userId }, ms) {
      const key = keys.userActions(tenantId, userId);
      const members = await redis.zrange(key, '0', '-1');
      if (members.length === 0) return;
      const aging = redis.multi();
      for (const member of members) aging.zincrby(key, -ms, member);
      await aging.exec();
    },
    async teardown() {
      await deleteKeys(redis, keys.prefix);
      redis.disconnect();
    },
  });
});
