// The Redis Lua scripts of the cluster (libs/cluster/src/lua), each run
// directly against real Redis through the loader the limiters use, on keys
// under a key prefix of each test's own that is removed afterwards. The
// scripts read the time from Redis (`TIME`), so windows and slot lifetimes
// are short here, and times are checked against Redis' clock.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ClusterKeys, RedisUserActionRateLimiter } from '@cs/cluster';
import { runScript } from '../../libs/cluster/src/redis/lua-scripts.js';
import { deleteKeys, testRedisUrl, uniqueName } from '../support/services.js';

let redis: Redis;
let keys: ClusterKeys;
const tenant = 'tenant-1';
const user = 'alice';

beforeAll(() => {
  redis = new Redis(testRedisUrl(), { maxRetriesPerRequest: 1 });
});

afterAll(() => {
  redis.disconnect();
});

beforeEach(() => {
  keys = new ClusterKeys(uniqueName('lua'));
});

afterEach(async () => {
  await deleteKeys(redis, keys.prefix);
  // Nothing of the test is left behind.
  expect(await redis.keys(`${keys.prefix}:*`)).toEqual([]);
});

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Redis' clock in ms, the one the scripts read. */
async function redisNow(): Promise<number> {
  const [seconds, micros] = await redis.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

describe('reserve-action-1.lua', () => {
  const reserve = (limit: number, windowMs: number, member: string, count?: number) =>
    runScript(
      redis,
      'reserve-action-1',
      [keys.userActions(tenant, user)],
      count === undefined ? [limit, windowMs, member] : [limit, windowMs, member, count],
    ) as Promise<number>;
  const logged = () => redis.zrange(keys.userActions(tenant, user), '0', '-1');

  it('grants actions up to the limit within the window and refuses the next', async () => {
    const before = await redisNow();
    const granted = [];
    for (const member of ['a1', 'a2', 'a3']) granted.push(await reserve(3, 60_000, member));
    const after = await redisNow();
    // Each reservation answers with the time it was logged at.
    for (const time of granted) {
      expect(time).toBeGreaterThanOrEqual(before);
      expect(time).toBeLessThanOrEqual(after);
    }
    expect(await reserve(3, 60_000, 'a4')).toBeLessThan(-1);
    expect(await reserve(3, 60_000, 'a5')).toBeLessThan(-1);
    // A refused action is not logged: it does not count.
    expect((await logged()).sort()).toEqual(['a1', 'a2', 'a3']);
    // The log lives no longer than the window.
    const ttl = await redis.pttl(keys.userActions(tenant, user));
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });

  it('frees each action once the window has passed it (a sliding window)', async () => {
    const windowMs = 1000;
    expect(await reserve(2, windowMs, 'first')).toBeGreaterThan(0);
    await sleep(500);
    expect(await reserve(2, windowMs, 'second')).toBeGreaterThan(0);
    // Refused, with the time until the first leaves the window: -1 - that many ms.
    const refused = await reserve(2, windowMs, 'refused');
    expect(-1 - refused).toBeGreaterThan(0);
    expect(-1 - refused).toBeLessThanOrEqual(500);
    // 1,100 ms on, the first has left the window, the second has not: room for one.
    await sleep(600);
    expect(await reserve(2, windowMs, 'third')).toBeGreaterThan(0);
    expect(await reserve(2, windowMs, 'refused again')).toBeLessThan(-1);
    expect((await logged()).sort()).toEqual(['second', 'third']);
    // With nothing reserved for a whole window, the key itself is gone.
    expect(await redis.pttl(keys.userActions(tenant, user))).toBeLessThanOrEqual(windowMs);
    await expect
      .poll(() => redis.exists(keys.userActions(tenant, user)), {
        timeout: windowMs + 1000,
        interval: 50,
      })
      .toBe(0);
  });

  it('reserves several actions all at once or none', async () => {
    expect(await reserve(5, 60_000, 'batch', 3)).toBeGreaterThan(0);
    expect((await logged()).sort()).toEqual(['batch', 'batch#2', 'batch#3']);
    // Three more do not fit in the two left: none is taken.
    // Room comes when the oldest leaves, a window after it came.
    const tooMany = await reserve(5, 60_000, 'too many', 3);
    expect(-1 - tooMany).toBeGreaterThan(59_000);
    expect(-1 - tooMany).toBeLessThanOrEqual(60_000);
    expect(await logged()).toHaveLength(3);
    // More than the limit never fits: -1.
    expect(await reserve(5, 60_000, 'never', 6)).toBe(-1);
    expect(await reserve(5, 60_000, 'pair', 2)).toBeGreaterThan(0);
    expect(await logged()).toHaveLength(5);
    expect(await reserve(5, 60_000, 'one more')).toBeLessThan(-1);
  });

  it('keeps users apart', async () => {
    const other = keys.userActions(tenant, 'bob');
    expect(await reserve(1, 60_000, 'alice 1')).toBeGreaterThan(0);
    expect(await reserve(1, 60_000, 'alice 2')).toBeLessThan(-1);
    expect(
      await runScript(redis, 'reserve-action-1', [other], [1, 60_000, 'bob 1']),
    ).toBeGreaterThan(0);
  });

  describe(RedisUserActionRateLimiter.name, () => {
    it('gives a cancelled reservation back to the window, all of its actions', async () => {
      const limiter = new RedisUserActionRateLimiter(redis, keys, 4);
      const single = await limiter.reserve(tenant, user);
      const triple = await limiter.reserve(tenant, user, 3);
      if (!single.reserved || !triple.reserved) throw new Error('not reserved');
      const refused = await limiter.reserve(tenant, user);
      if (refused.reserved) throw new Error('reserved past the limit');
      expect(refused.retryAfterMs).toBeGreaterThan(59_000);
      expect(refused.retryAfterMs).toBeLessThanOrEqual(60_000);
      await triple.cancel();
      expect(await logged()).toHaveLength(1);
      const again = await limiter.reserve(tenant, user, 3);
      expect(again.reserved).toBe(true);
      expect(await limiter.reserve(tenant, user)).toMatchObject({ reserved: false });
      await single.cancel();
      expect(await limiter.reserve(tenant, user)).toMatchObject({ reserved: true });
      expect(await limiter.reserve(tenant, user, 5)).toEqual({
        reserved: false,
        retryAfterMs: null,
      });
      expect(await logged()).toHaveLength(4);
    });

    it('reserves without Redis when the limit is 0 (off)', async () => {
      const limiter = new RedisUserActionRateLimiter(redis, keys, 0);
      for (let n = 0; n < 50; n += 1)
        expect(await limiter.reserve(tenant, user)).toMatchObject({ reserved: true });
      expect(await redis.exists(keys.userActions(tenant, user))).toBe(0);
    });
  });
});

describe('acquire-slot-2.lua, renew-slots-2.lua, release-slot-2.lua', () => {
  type Policy = 'evict_oldest' | 'reject';
  const slotKeys = () => [keys.userRunning(tenant, user), keys.userSlotExpiry(tenant, user)];
  const acquire = (conversation: string, limit: number, policy: Policy, ttlMs = 60_000) =>
    runScript(redis, 'acquire-slot-2', slotKeys(), [conversation, limit, policy, ttlMs]) as Promise<
      [number, string?]
    >;
  const release = (conversation: string) =>
    runScript(redis, 'release-slot-2', slotKeys(), [conversation]) as Promise<number>;
  /** Renews slots: pairs of conversation id and last activity (0: unchanged). */
  const renew = (ttlMs: number, ...slots: Array<[string, number]>) =>
    runScript(redis, 'renew-slots-2', slotKeys(), [ttlMs, ...slots.flat()]) as Promise<string[]>;
  const running = async () =>
    (await redis.zrange(keys.userRunning(tenant, user), '0', '-1')).sort();
  const expiries = () => redis.hgetall(keys.userSlotExpiry(tenant, user));
  const activityOf = async (conversation: string) =>
    Number(await redis.zscore(keys.userRunning(tenant, user), conversation));

  describe('acquire', () => {
    it.each(['reject', 'evict_oldest'] as const)(
      'grants slots up to the limit, each with its expiry (%s)',
      async (policy) => {
        const before = await redisNow();
        expect(await acquire('c1', 2, policy, 5000)).toEqual([1]);
        expect(await acquire('c2', 2, policy, 5000)).toEqual([1]);
        const after = await redisNow();
        expect(await running()).toEqual(['c1', 'c2']);
        const expiry = await expiries();
        expect(Object.keys(expiry).sort()).toEqual(['c1', 'c2']);
        for (const at of Object.values(expiry)) {
          expect(Number(at)).toBeGreaterThanOrEqual(before + 5000);
          expect(Number(at)).toBeLessThanOrEqual(after + 5000);
        }
      },
    );

    it('refuses a slot beyond the limit under the reject policy, changing nothing', async () => {
      await acquire('c1', 2, 'reject');
      await acquire('c2', 2, 'reject');
      const expiry = await expiries();
      expect(await acquire('c3', 2, 'reject')).toEqual([0]);
      expect(await running()).toEqual(['c1', 'c2']);
      expect(await expiries()).toEqual(expiry);
    });

    it('keeps a held slot when its conversation asks again, even at the limit, saying so', async () => {
      expect(await acquire('c1', 1, 'reject')).toEqual([1]);
      for (const policy of ['reject', 'evict_oldest'] as const) {
        expect(await acquire('c1', 1, policy)).toEqual([3]);
      }
      expect(await running()).toEqual(['c1']);
    });

    it('evicts the conversation with the oldest activity under evict_oldest', async () => {
      await acquire('c1', 2, 'evict_oldest');
      await acquire('c2', 2, 'evict_oldest');
      // c2 was active longest ago, whatever the order the slots were taken in.
      await renew(60_000, ['c1', 2_000], ['c2', 1_000]);
      expect(await acquire('c3', 2, 'evict_oldest')).toEqual([2, 'c2']);
      expect(await running()).toEqual(['c1', 'c3']);
      expect(Object.keys(await expiries()).sort()).toEqual(['c1', 'c3']);
      // The newcomer's activity is now; c1's (2 s after 1970) is the oldest next.
      expect(await acquire('c4', 2, 'evict_oldest')).toEqual([2, 'c1']);
      expect(await running()).toEqual(['c3', 'c4']);
    });

    it('frees slots whose holder stopped renewing them, on the next acquire', async () => {
      expect(await acquire('crashed-1', 2, 'reject', 500)).toEqual([1]);
      expect(await acquire('crashed-2', 2, 'reject', 500)).toEqual([1]);
      expect(await acquire('waiting', 2, 'reject', 500)).toEqual([0]);
      await sleep(600);
      // Lapsed: free again, for a new conversation without evicting anyone.
      expect(await acquire('new', 2, 'evict_oldest', 60_000)).toEqual([1]);
      expect(await running()).toEqual(['new']);
      expect(Object.keys(await expiries())).toEqual(['new']);
    });
  });

  describe('renew', () => {
    it('keeps renewed slots alive past their first lifetime', async () => {
      await acquire('kept', 1, 'reject', 600);
      for (let n = 0; n < 6; n += 1) {
        await sleep(150);
        expect(await renew(600, ['kept', 0])).toEqual([]);
      }
      // 900 ms after taking it, beyond its 600 ms lifetime: still held.
      expect(await acquire('other', 1, 'reject', 600)).toEqual([0]);
      expect(await running()).toEqual(['kept']);
    });

    it('moves the expiry forward and records activity, or leaves it with 0', async () => {
      await acquire('c1', 3, 'reject', 1000);
      await acquire('c2', 3, 'reject', 1000);
      const taken = Number((await expiries()).c1);
      const c2Activity = await activityOf('c2');
      await sleep(20);
      const before = await redisNow();
      expect(await renew(60_000, ['c1', 12_345], ['c2', 0])).toEqual([]);
      const expiry = await expiries();
      expect(Number(expiry.c1)).toBeGreaterThanOrEqual(before + 60_000);
      expect(Number(expiry.c1)).toBeGreaterThan(taken);
      expect(Number(expiry.c2)).toBeGreaterThanOrEqual(before + 60_000);
      expect(await activityOf('c1')).toBe(12_345);
      expect(await activityOf('c2')).toBe(c2Activity);
    });

    it('reports slots no longer held and never brings them back', async () => {
      await acquire('evicted', 1, 'evict_oldest');
      expect(await acquire('newer', 1, 'evict_oldest')).toEqual([2, 'evicted']);
      await acquire('released', 2, 'reject');
      await release('released');
      expect(
        await renew(60_000, ['newer', 0], ['evicted', 5], ['released', 0], ['never', 0]),
      ).toEqual(['evicted', 'released', 'never']);
      expect(await running()).toEqual(['newer']);
      expect(Object.keys(await expiries())).toEqual(['newer']);
    });
  });

  describe('release', () => {
    it('frees the slot for another conversation; a second release finds nothing', async () => {
      await acquire('c1', 1, 'reject');
      expect(await acquire('c2', 1, 'reject')).toEqual([0]);
      expect(await release('c1')).toBe(1);
      expect(await running()).toEqual([]);
      expect(await expiries()).toEqual({});
      expect(await release('c1')).toBe(0);
      expect(await acquire('c2', 1, 'reject')).toEqual([1]);
    });

    it('leaves the slots of other conversations and users alone', async () => {
      await acquire('mine', 2, 'reject');
      await acquire('kept', 2, 'reject');
      const bobs = [keys.userRunning(tenant, 'bob'), keys.userSlotExpiry(tenant, 'bob')];
      await runScript(redis, 'acquire-slot-2', bobs, ['mine', 2, 'reject', 60_000]);
      expect(await release('mine')).toBe(1);
      expect(await running()).toEqual(['kept']);
      expect(await redis.zrange(bobs[0]!, '0', '-1')).toEqual(['mine']);
    });
  });
});

// A reservation's member is unique per call (the limiter uses UUIDs): two
// concurrent reservations never overwrite each other's entry.
describe('record-failover-1.lua', () => {
  const conversation = 'conversation-1';
  const record = (windowMs: number, work: string) =>
    runScript(
      redis,
      'record-failover-1',
      [keys.conversationFailovers(conversation)],
      [windowMs, work, randomUUID()],
    ) as Promise<number>;

  it('counts the crashes on the same work, this one included', async () => {
    expect(await record(60_000, 'message:3')).toBe(1);
    expect(await record(60_000, 'message:3')).toBe(2);
    expect(await record(60_000, 'loading')).toBe(1);
    // `message:3` is not a prefix match of `message:30`.
    expect(await record(60_000, 'message:30')).toBe(1);
    expect(await record(60_000, 'message:3')).toBe(3);
    const members = await redis.zrange(keys.conversationFailovers(conversation), '0', '-1');
    expect(members).toHaveLength(5);
    const ttl = await redis.pttl(keys.conversationFailovers(conversation));
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });

  it('forgets crashes older than the window; the record expires a window after the last', async () => {
    const before = await redisNow();
    expect(await record(500, 'message:1')).toBe(1);
    const [, score] = await redis.zrange(
      keys.conversationFailovers(conversation),
      '0',
      '0',
      'WITHSCORES',
    );
    expect(Number(score)).toBeGreaterThanOrEqual(before);
    await sleep(300);
    expect(await record(500, 'message:1')).toBe(2);
    await sleep(300);
    // The first is 600 ms old: gone; the second is not.
    expect(await record(500, 'message:1')).toBe(2);
    await sleep(600);
    expect(await redis.exists(keys.conversationFailovers(conversation))).toBe(0);
  });
});

describe('concurrent reservations', () => {
  it('grant exactly the limit when many arrive at once', async () => {
    const results = await Promise.all(
      Array.from(
        { length: 50 },
        () =>
          runScript(
            redis,
            'reserve-action-1',
            [keys.userActions(tenant, user)],
            [7, 60_000, randomUUID()],
          ) as Promise<number>,
      ),
    );
    expect(results.filter((r) => r > 0)).toHaveLength(7);
    expect(await redis.zcard(keys.userActions(tenant, user))).toBe(7);
  });
});
