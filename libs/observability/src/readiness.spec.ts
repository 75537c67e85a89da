import { describe, expect, it } from 'vitest';
import { redisCheck, singleFlight, unreachableDependencies } from './readiness.js';

describe(unreachableDependencies.name, () => {
  it('names the checks that fail or do not answer in time', async () => {
    const started = Date.now();
    const failures = await unreachableDependencies(
      [
        { name: 'database', check: () => Promise.resolve() },
        { name: 'redis', check: () => new Promise(() => undefined) },
        { name: 'other', check: () => Promise.reject(new Error('refused')) },
      ],
      200,
    );
    expect(failures.sort()).toEqual(['other', 'redis']);
    expect(Date.now() - started).toBeLessThan(1_000);
  });
});

describe(redisCheck.name, () => {
  it('fails at once when the connection is not ready, without queueing a PING', async () => {
    let pings = 0;
    const connection = { status: 'reconnecting', ping: () => Promise.resolve(String(++pings)) };
    await expect(redisCheck(connection).check()).rejects.toThrow(/reconnecting/);
    expect(pings).toBe(0);
    connection.status = 'ready';
    await redisCheck(connection).check();
    expect(pings).toBe(1);
  });
});

describe(singleFlight.name, () => {
  it('shares a pending check with the probes that come meanwhile', async () => {
    let runs = 0;
    let finish = () => undefined as void;
    const check = singleFlight(() => {
      runs += 1;
      return new Promise<void>((resolve) => (finish = resolve));
    });
    const first = check();
    const second = check();
    expect(runs).toBe(1);
    finish();
    await Promise.all([first, second]);
    void check();
    expect(runs).toBe(2);
    finish();
  });
});
