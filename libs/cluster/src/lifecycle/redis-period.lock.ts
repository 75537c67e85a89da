import { randomBytes } from 'node:crypto';
import type { PeriodLock } from '@cs/core';
import type { RedisConnection } from '../redis/redis-connections.js';

/**
 * A `PeriodLock` on one Redis key: `SET NX PX period`. Whoever sets it has
 * the period; nobody releases it, it expires. The holder keeps its work
 * within the period, so two holders never overlap; one that dies midway
 * leaves the rest to the next period's holder.
 */
export class RedisPeriodLock implements PeriodLock {
  private readonly owner = randomBytes(8).toString('hex');

  constructor(
    private readonly redis: RedisConnection,
    private readonly key: string,
  ) {}

  async claim(periodMs: number): Promise<boolean> {
    return (await this.redis.set(this.key, this.owner, 'PX', periodMs, 'NX')) === 'OK';
  }
}
