import { StartupError } from '@cs/config';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * Every process of a deployment must split conversations over the same
 * queues: a gateway with another count would add jobs to queues no worker
 * of the others consumes, or look for a job in the wrong one. The first
 * process to start records its `CONVERSATION_QUEUES` (a key without expiry,
 * set if absent); every later one compares, and refuses to start, with one
 * line, when it differs. Changing the count: docs/configuration.md.
 */
export async function claimQueueCount(
  redis: RedisConnection,
  keys: ClusterKeys,
  count: number,
): Promise<void> {
  const key = keys.conversationQueueCount;
  await redis.set(key, String(count), 'NX');
  const recorded = await redis.get(key);
  if (recorded === null || Number(recorded) === count) return;
  throw new StartupError(
    `CONVERSATION_QUEUES: the deployment (KEY_PREFIX ${keys.prefix}) uses ${recorded} queues, this process was given ${count}; give every gateway and worker the same number (to change it, see docs/configuration.md)`,
  );
}
