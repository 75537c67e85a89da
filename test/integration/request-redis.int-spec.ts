// The gateway's connection for what a request waits on (`openRequestRedis`),
// on a private redis-server that is stopped and started again: a command
// fails at once while Redis is away, and one in flight when it went is not
// sent again once it is back (the client was told it failed).
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { UnavailableError } from '@cs/core';
import { assertConnected, connected, openRequestRedis } from '@cs/cluster';
import { startPrivateRedis, type PrivateRedis } from '../support/redis-server.js';
import { uniqueName } from '../support/services.js';

/** Far below the commands' timeout: the failure comes from the closed connection. */
const AT_ONCE_MS = 500;

let server: PrivateRedis;

beforeAll(async () => {
  server = await startPrivateRedis();
});

afterAll(async () => {
  await server?.stop();
});

/** A plain connection for the test's own checks, that gives up rather than wait. */
function probe(): Redis {
  const redis = new Redis(server.url, { maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined); // refused while the server restarts
  return redis;
}

async function failure(promise: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const started = Date.now();
  try {
    await promise;
  } catch (error) {
    return { error, ms: Date.now() - started };
  }
  throw new Error('the command succeeded while Redis was down');
}

describe(openRequestRedis.name, () => {
  it('fails commands and queue adds at once while Redis is down, and works again once it is back', async () => {
    const redis = openRequestRedis(server.url, uniqueName('request'));
    const queue = new Queue(uniqueName('queue'), { connection: redis });
    try {
      await connected(redis);
      await queue.add('before', {});
      // Down until what is tried meanwhile has failed.
      let outageOver!: () => void;
      const over = new Promise<void>((resolve) => (outageOver = resolve));
      const back = server.restart(() => over);
      await expect.poll(() => redis.status, { timeout: 2_000 }).not.toBe('ready');

      expect(() => assertConnected(redis)).toThrow(UnavailableError);
      for (const attempt of [redis.ping(), queue.add('during', {}), redis.publish('c', 'm')]) {
        const { ms } = await failure(attempt);
        expect(ms).toBeLessThan(AT_ONCE_MS);
      }

      outageOver();
      await back;
      await connected(redis);
      expect(() => assertConnected(redis)).not.toThrow();
      await queue.add('after', {});
      const names = (await queue.getJobs(['waiting'])).map((job) => job.name).sort();
      expect(names).toEqual(['after', 'before']);
    } finally {
      await queue.obliterate({ force: true }).catch(() => undefined);
      await queue.close();
      redis.disconnect();
    }
  });

  it('does not send again, once Redis is back, a command that was in flight when it went', async () => {
    const key = uniqueName('in-flight');
    const redis = openRequestRedis(server.url, uniqueName('request'));
    const admin = probe();
    try {
      await connected(redis);
      // Writes are held unanswered by the server: the INCR is sent and waits.
      await admin.call('CLIENT', 'PAUSE', '20000', 'WRITE');
      const inFlight = failure(redis.incr(key));
      await new Promise((resolve) => setTimeout(resolve, 200));
      admin.disconnect();
      const back = server.restart(0);
      // It fails with the connection, long before its timeout.
      expect((await inFlight).ms).toBeLessThan(1_500);

      await back;
      await connected(redis);
      await redis.ping(); // anything sent again on reconnection is answered before this
      const check = probe();
      try {
        expect(await check.get(key)).toBeNull();
      } finally {
        check.disconnect();
      }
    } finally {
      admin.disconnect();
      redis.disconnect();
    }
  });
});
