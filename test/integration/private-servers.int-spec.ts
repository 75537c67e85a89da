// The servers the tests start for themselves (a Redis Cluster's nodes, a
// private Redis, PgBouncer, the apps) on ports picked free a moment before: when
// another file's server took the port first, the one answering there is
// never taken for the test's own (three files run at once; two of them once
// built their Redis Clusters on one shared node).
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { standaloneDataDir } from '../support/migrated-template.js';
import { listensOn, startApp } from '../support/processes.js';
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

describe('an app on a port another process answers its health check on', () => {
  let other: Server;
  let port: number;
  beforeAll(async () => {
    // What another file's gateway or worker would answer: 200 on every path.
    other = createServer((_request, response) => response.end('{"status":"ok"}'));
    await new Promise<void>((resolve) => other.listen(0, '127.0.0.1', resolve));
    port = (other.address() as AddressInfo).port;
  });
  afterAll(async () => {
    await new Promise((resolve) => other?.close(resolve));
  });

  it('is known not to hold that port', () => {
    expect(listensOn(process.pid, port)).toBe(true);
    expect(listensOn(process.ppid, port)).toBe(false);
  });

  it('is not taken for started: it exits with EADDRINUSE, and the start says so', async () => {
    const dir = standaloneDataDir('cs-ports-');
    try {
      await expect(
        startApp('standalone', { DATA_DIR: dir, PORT: String(port) }, { timeoutMs: 30_000 }),
      ).rejects.toThrow(/exited \(\d+\) before it was healthy[\s\S]*EADDRINUSE/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
