// A local Redis Cluster from Debian's redis-server (7.0): three masters with a
// replica each, on free ports (and their cluster-bus ports) in a temporary
// folder; `stop()` kills every node and removes the folder. Shared by the
// tests (test/support/redis-cluster.ts), the benchmark and the chaos run,
// which also kill a master (`kill`), bring it back as a replica (`restart`),
// fail a master over to its replica (`failover`) and count the commands the
// masters ran (`commandCalls`).
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { freePorts } from './ports.mjs';

/** Node timeout of the local cluster: a master is failed over about 2 × this after it dies. */
export const CLUSTER_NODE_TIMEOUT_MS = 2_000;

const NODES = 6;

/** True when Debian's redis-server and redis-cli are installed (`.ci/run` installs them). */
export function redisClusterAvailable() {
  return (
    spawnSync('redis-server', ['--version']).status === 0 &&
    spawnSync('redis-cli', ['--version']).status === 0
  );
}

/** The server of one node: its port, bus port and files in `dir` (the same on a restart). */
function launch(dir, port, busPort, nodeTimeoutMs) {
  return spawn(
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
      String(nodeTimeoutMs),
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
}

const exited = (child) => child.exitCode !== null || child.signalCode !== null;

function killNow(child) {
  return new Promise((resolve) => {
    if (exited(child)) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}

/**
 * `nodeTimeoutMs` (default CLUSTER_NODE_TIMEOUT_MS): how long a node may go
 * unanswered before the others fail it over. Suites that inject no Redis
 * fault give a long one, so that a machine too busy to schedule a node for
 * 2 s does not fail it over under them.
 */
export async function startRedisCluster({ nodeTimeoutMs = CLUSTER_NODE_TIMEOUT_MS } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'cs-redis-cluster-'));
  const nodes = [];
  const stop = async () => {
    await Promise.all(nodes.map((node) => killNow(node.process)));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await Promise.all(Array.from({ length: NODES }, () => startNode(dir, nodeTimeoutMs, nodes)));
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
    const cluster = {
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
      async slotsOf(port) {
        return withNode(port, async (redis) => {
          const slots = await redis.cluster('SLOTS');
          return slots.filter(([, , master]) => master[1] === port).map(([from, to]) => [from, to]);
        });
      },
      kill: (node) => killNow(node.process),
      async restart(node) {
        await killNow(node.process);
        node.process = launch(dir, node.port, node.busPort, nodeTimeoutMs);
        await waitForNode(node.port, 10_000, node.process);
      },
      async failover(replica) {
        await withNode(replica.port, (redis) => redis.cluster('FAILOVER'));
      },
      async commandCalls() {
        const calls = {};
        for (const node of await cluster.masters()) {
          for (const [command, count] of Object.entries(await commandCallsAt(node.port))) {
            calls[command] = (calls[command] ?? 0) + count;
          }
        }
        return calls;
      },
      pids: () => nodes.filter((node) => !exited(node.process)).map((node) => node.process.pid),
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

/** Calls of each command so far on the Redis (node) on `port` (INFO commandstats); {} when down. */
export async function commandCallsAt(port) {
  const text = await withNode(port, (redis) => redis.info('commandstats')).catch(() => '');
  return Object.fromEntries(parseCommandStats(text));
}

/** `cmdstat_<name>:calls=<n>,…` lines of INFO commandstats → [name, calls]. */
export function parseCommandStats(text) {
  const result = [];
  for (const match of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) {
    result.push([match[1], Number(match[2])]);
  }
  return result;
}

/**
 * Launches a node on ports free a moment ago and waits for its answer. Another
 * process may bind a port between its pick and the node's bind (the node then
 * exits at once): the node is launched again on other ports, up to 3 times
 * (ports.mjs).
 * The node is in `nodes` from its launch on, so that a failed start stops it.
 */
async function startNode(dir, nodeTimeoutMs, nodes) {
  for (let attempt = 1; ; attempt++) {
    const [port = 0, busPort = 0] = await freePorts(2);
    const node = {
      port,
      busPort,
      url: `redis://127.0.0.1:${port}`,
      process: launch(dir, port, busPort, nodeTimeoutMs),
    };
    nodes.push(node);
    try {
      await waitForNode(port, 10_000, node.process);
      return;
    } catch (error) {
      if (attempt === 3) throw error;
      await killNow(node.process);
      nodes.splice(nodes.indexOf(node), 1);
    }
  }
}

async function withNode(port, run) {
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

/**
 * Waits until the node on `port` answers; gives up at once if its `child`
 * process exited, or if the server answering there is another process.
 */
export async function waitForNode(port, timeoutMs = 10_000, child = undefined) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child && exited(child)) {
      throw new Error(
        `redis-server on port ${port} exited (${child.exitCode ?? child.signalCode})`,
      );
    }
    let answered;
    try {
      answered = await withNode(port, (redis) => redis.info('server'));
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 50));
      continue;
    }
    // Another run's node took the port between its pick and this node's bind
    // (this one then exits, unable to listen): it must not join this cluster.
    const pid = Number(/process_id:(\d+)/.exec(answered)?.[1]);
    if (child && pid !== child.pid) {
      throw new Error(`port ${port} is another redis-server's (pid ${pid}, not ${child.pid})`);
    }
    return;
  }
}

async function roleOf(port) {
  try {
    return await withNode(port, async (redis) => {
      const info = await redis.info('replication');
      return /role:(\w+)/.exec(info)?.[1] ?? null;
    });
  } catch {
    return null; // dead
  }
}

async function masterPortOf(port) {
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
async function waitHealthy(nodes, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let last;
    try {
      const views = await Promise.all(
        nodes.map(async (node) => {
          try {
            return await withNode(node.port, async (redis) => {
              const info = String(await redis.cluster('INFO'));
              const slots = await redis.cluster('SLOTS');
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
      if (live.length > 0 && live.every((view) => view.ok && view.owners === live[0].owners)) {
        return;
      }
    } catch (error) {
      last = String(error);
    }
    if (Date.now() > deadline) throw new Error(`the Redis Cluster is not healthy: ${last}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
