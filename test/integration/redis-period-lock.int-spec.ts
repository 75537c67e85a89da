// Retention's sweep goes to one process of a cluster per interval: the
// `RedisPeriodLock` on real Redis.
import { RedisPeriodLock } from '@cs/cluster';
import { afterAll, describe, expect, it } from 'vitest';
import { uniqueName } from '../support/services.js';
import { deleteTestKeys, openTestRedis, useTestRedis } from '../support/test-redis.js';

useTestRedis();

describe(RedisPeriodLock.name, () => {
  const prefix = uniqueName('cs_lock');
  const redis = openTestRedis();

  afterAll(async () => {
    redis.disconnect();
    await deleteTestKeys(prefix);
  });

  it('gives each period to one process, and the next period to whoever asks first', async () => {
    const key = `${prefix}:{lifecycle}:retention-sweep`;
    const processes = Array.from({ length: 4 }, () => new RedisPeriodLock(redis, key));
    const first = await Promise.all(processes.map((lock) => lock.claim(300)));
    expect(first.filter(Boolean)).toHaveLength(1);
    // Nobody again within the period, the holder neither (its work fits in it).
    expect(await Promise.all(processes.map((lock) => lock.claim(300)))).toEqual([
      false,
      false,
      false,
      false,
    ]);
    await new Promise((resolve) => setTimeout(resolve, 350));
    const next = await Promise.all(processes.map((lock) => lock.claim(300)));
    expect(next.filter(Boolean)).toHaveLength(1);
  });
});
