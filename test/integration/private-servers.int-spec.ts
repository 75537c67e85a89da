// The servers the tests start for themselves (a Redis Cluster's nodes, a
// private Redis, PgBouncer) on ports picked free a moment before: when
// another file's server took the port first, the one answering there is
// never taken for the test's own (three files run at once; two of them once
// built their Redis Clusters on one shared node).
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPgBouncer, startPgBouncerOn, type PrivatePgBouncer } from '../support/pgbouncer.js';
import { waitForNode } from '../support/redis-cluster.js';
import { startPrivateRedis, type PrivateRedis } from '../support/redis-server.js';

describe('a Redis on a port another Redis answers on', () => {
  let other: PrivateRedis;
  beforeAll(async () => {
    other = await startPrivateRedis();
  });
  afterAll(async () => {
    await other?.stop();
  });

  it('is not mistaken for the server that answers there', async () => {
    // A process that is no redis-server at all, as one that failed to bind is.
    const notTheServer = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      await expect(waitForNode(other.port, 5_000, notTheServer)).rejects.toThrow(
        /is another redis-server's/,
      );
      await expect(waitForNode(other.port, 5_000)).resolves.toBeUndefined();
    } finally {
      notTheServer.kill('SIGKILL');
    }
  });
});

describe('a PgBouncer on a port another PgBouncer answers on', () => {
  let other: PrivatePgBouncer;
  beforeAll(async () => {
    other = await startPgBouncer();
  });
  afterAll(async () => {
    await other?.stop();
  });

  it('is refused instead of sending the test through the other', async () => {
    await expect(startPgBouncerOn(other.port)).rejects.toThrow(/did not start/);
  });
});
