// A local Redis Cluster for tests, from Debian's redis-server (7.0): three
// masters with a replica each, on free ports (and their cluster-bus ports) in
// a temporary folder; `stop()` kills every node and removes the folder.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';

/** Node timeout of the test cluster: a master is failed over about 2 × this after it dies. */
export const CLUSTER_NODE_TIMEOUT_MS = 2_000;

export interface RedisClusterNode {
  port: number;
  url: string;
  process: ChildProcess;
}

export interface LocalRedisCluster {
  /** Every node, masters and replicas (roles change on failover: see `masters()`). */
  nodes: RedisClusterNode[];
  /** `REDIS_CLUSTER_URLS` for the apps: every node, comma-separated. */
  urls: string;
  /** The nodes that are masters now. */
  masters(): Promise<RedisClusterNode[]>;
  /** The replicas of the master on `port`, as it reports them. */
  replicasOf(port: number): Promise<RedisClusterNode[]>;
  /** Waits until every live node says `cluster_state:ok` and agrees on the slot owners. */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** Kills every node and removes the folder. */
  stop(): Promise<void>;
}

/** True when Debian's redis-server and redis-cli are installed (`.ci/run` installs them). */
export function redisClusterAvailable(): boolean {
  return (
    spawnSync('redis-server', ['--version']).status === 0 &&
    spawnSync('redis-cli', ['--version']).status === 0
  );
}

export async function startRedisCluster(): Promise<LocalRedisCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'cs-redis-cluster-'));
  const nodes: RedisClusterNode[] = [];
  const stop = async () => {
    await Promise.all(
      nodes.map(
        (node) =>
          new Promise<void>((resolve) => {
            if (node.process.exitCode !== null || node.process.signalCode !== null)
              return resolve();
            node.process.once('exit', () => resolve());
            node.process.kill('SIGKILL');
          }),
      ),
    );
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < 6; i++) {
      const [port = 0, busPort = 0] = await freePorts(2);
      const child = spawn(
        'redis-server',
        [
          '--port',
          String(port),
          '--cluster-port',
          String(busPort),
          '--bind',
          '127.0.0.1',
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir, `nodes-${port}.conf`),
          '--cluster-node-timeout',
          String(CLUSTER_NODE_TIMEOUT_MS),
          // A replica that has not finished its first sync may still take over.
          '--cluster-replica-validity-factor',
          '0',
          '--dir',
          dir,
          '--dbfilename',
          `dump-${port}.rdb`,
          '--save',
          '',
          '--appendonly',
          'no',
          '--maxmemory-policy',
          'noeviction',
        ],
        { stdio: 'ignore', cwd: dir },
      );
      nodes.push({ port, url: `redis://127.0.0.1:${port}`, process: child });
    }
    await Promise.all(nodes.map((node) => waitForPing(node.port)));
    const created = spawnSync(
      'redis-cli',
      [
        '--cluster',
        'create',
        ...nodes.map((node) => `127.0.0.1:${node.port}`),
        '--cluster-replicas',
        '1',
        '--cluster-yes',
      ],
      { encoding: 'utf8', timeout: 30_000 },
    );
    if (created.status !== 0) {
      throw new Error(`redis-cli --cluster create failed: ${created.stdout}${created.stderr}`);
    }
    const cluster: LocalRedisCluster = {
      nodes,
      urls: nodes.map((node) => node.url).join(','),
      async masters() {
        const roles = await Promise.all(nodes.map((node) => roleOf(node.port)));
        return nodes.filter((_, i) => roles[i] === 'master');
      },
      async replicasOf(port) {
        const replicas = await Promise.all(
          nodes.map(async (node) => (await masterPortOf(node.port)) === port),
        );
        return nodes.filter((_, i) => replicas[i]);
      },
      waitHealthy: (timeoutMs = 30_000) => waitHealthy(nodes, timeoutMs),
      stop,
    };
    await cluster.waitHealthy();
    return cluster;
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Ports nobody listens on now (the OS picks them; closed again at once). */
async function freePorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
          const server = createServer();
          server.once('error', reject);
          server.listen(0, '127.0.0.1', () => resolve(server));
        }),
    ),
  );
  const ports = servers.map((server) => (server.address() as { port: number }).port);
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  return ports;
}

async function withNode<T>(port: number, run: (redis: Redis) => Promise<T>): Promise<T> {
  const redis = new Redis({
    port,
    host: '127.0.0.1',
    lazyConnect: true,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    connectTimeout: 1_000,
    commandTimeout: 1_000,
  });
  redis.on('error', () => undefined);
  try {
    await redis.connect();
    return await run(redis);
  } finally {
    redis.disconnect();
  }
}

async function waitForPing(port: number, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await withNode(port, (redis) => redis.ping());
      return;
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

async function roleOf(port: number): Promise<string | null> {
  try {
    return await withNode(port, async (redis) => {
      const info = await redis.info('replication');
      return /role:(\w+)/.exec(info)?.[1] ?? null;
    });
  } catch {
    return null; // dead
  }
}

async function masterPortOf(port: number): Promise<number | null> {
  try {
    return await withNode(port, async (redis) => {
      const info = await redis.info('replication');
      const master = /master_port:(\d+)/.exec(info)?.[1];
      return master ? Number(master) : null;
    });
  } catch {
    return null;
  }
}

/** Every live node: `cluster_state:ok`, and the same view of which node serves each slot. */
async function waitHealthy(nodes: readonly RedisClusterNode[], timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let last: string;
    try {
      const views = await Promise.all(
        nodes.map(async (node) => {
          try {
            return await withNode(node.port, async (redis) => {
              const info = String(await redis.cluster('INFO'));
              const slots = (await redis.cluster('SLOTS')) as unknown as Array<
                [number, number, [string, number]]
              >;
              const owners = slots
                .map(([from, to, master]) => `${from}-${to}@${master[1]}`)
                .sort()
                .join(',');
              const covered = slots.reduce((sum, [from, to]) => sum + to - from + 1, 0);
              return { ok: /cluster_state:ok/.test(info) && covered === 16_384, owners };
            });
          } catch {
            return null; // a killed node takes no part
          }
        }),
      );
      const live = views.filter((view) => view !== null);
      last = JSON.stringify(live);
      if (live.length > 0 && live.every((view) => view.ok && view.owners === live[0]!.owners)) {
        return;
      }
    } catch (error) {
      last = String(error);
    }
    if (Date.now() > deadline) throw new Error(`the Redis Cluster is not healthy: ${last}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
