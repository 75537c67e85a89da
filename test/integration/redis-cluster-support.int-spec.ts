// The local Redis Cluster of the tests (test/support/redis-cluster.ts) and the
// connection factory on it: a cluster client reaches every master, sharded
// channels count their subscriber wherever it is, and the start-up check
// tells a cluster node from a lone Redis.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster } from 'ioredis';
import {
  ClusterKeys,
  ConversationInbox,
  checkRedisTarget,
  connected,
  masterFor,
  mastersOf,
  REQUEST_COMMAND_TIMEOUT_MS,
  REQUEST_REDIRECTIONS,
  openRedis,
  openRequestRedis,
  pingEveryMaster,
} from '@cs/cluster';
import { StartupError } from '@cs/config';
import { until } from '../support/cluster.js';
import { startRedisCluster, type LocalRedisCluster } from '../support/redis-cluster.js';
import { testRedisUrl, uniqueName } from '../support/services.js';

let cluster: LocalRedisCluster;

beforeAll(async () => {
  cluster = await startRedisCluster();
}, 60_000);

afterAll(async () => {
  await cluster?.stop();
});

describe('startRedisCluster', () => {
  it('starts three masters with a replica each, every slot served', async () => {
    expect(await cluster.masters()).toHaveLength(3);
    for (const master of await cluster.masters()) {
      expect(await cluster.replicasOf(master.port)).toHaveLength(1);
    }
  });
});

describe('openRedis on a Redis Cluster', () => {
  it('reaches every master, and readiness pings each of them', async () => {
    const redis = openRequestRedis({ clusterUrls: [cluster.nodes[0]!.url] }, uniqueName('probe'));
    try {
      await connected(redis);
      expect(redis).toBeInstanceOf(Cluster);
      expect(mastersOf(redis)).toHaveLength(3);
      await pingEveryMaster(redis);
    } finally {
      redis.disconnect();
    }
  });

  it('counts a holder subscribed on the conversation’s shard, whichever master it is on', async () => {
    const target = { clusterUrls: cluster.urls.split(',') };
    const keys = new ClusterKeys(uniqueName('inbox'));
    const publisher = openRedis(target, uniqueName('publisher'));
    const subscriber = openRedis(target, uniqueName('subscriber'));
    const holder = new ConversationInbox(publisher, subscriber, keys);
    const gateway = new ConversationInbox(publisher, null, keys);
    try {
      await Promise.all([connected(publisher), connected(subscriber)]);
      // Enough conversations that their channels fall on every master.
      const ids = Array.from(
        { length: 12 },
        (_, i) => `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`,
      );
      const masters = new Set(ids.map((id) => masterFor(publisher, keys.conversationChannel(id))));
      expect(masters.size).toBe(3);
      const received: string[] = [];
      for (const id of ids) await holder.listen(id, () => received.push(id));
      for (const id of ids) {
        expect(await gateway.holders(id)).toBe(1);
        expect(await gateway.send(id, { type: 'catch_up' })).toBe(1);
      }
      expect(await gateway.holders('00000000-0000-4000-8000-999999999999')).toBe(0);
      await expect.poll(() => received.length).toBe(ids.length);
    } finally {
      publisher.disconnect();
      subscriber.disconnect();
    }
  });
});

describe(checkRedisTarget.name, () => {
  it('refuses REDIS_URL at a cluster node, and a cluster list at a lone Redis or at nobody', async () => {
    await expect(checkRedisTarget({ url: cluster.nodes[0]!.url })).rejects.toThrow(
      new StartupError(
        `REDIS_URL: 127.0.0.1:${cluster.nodes[0]!.port} is a node of a Redis Cluster; set REDIS_CLUSTER_URLS to its nodes instead`,
      ),
    );
    await expect(checkRedisTarget({ clusterUrls: [testRedisUrl()] })).rejects.toThrow(
      /^REDIS_CLUSTER_URLS: .* is a lone Redis, not a node of a Redis Cluster/,
    );
    await expect(checkRedisTarget({ clusterUrls: ['redis://127.0.0.1:1'] })).rejects.toThrow(
      /^REDIS_CLUSTER_URLS: none of the seed nodes answers \(127\.0\.0\.1:1: /,
    );
    await expect(
      checkRedisTarget({ clusterUrls: cluster.urls.split(',') }),
    ).resolves.toBeUndefined();
    await expect(checkRedisTarget({ url: testRedisUrl() })).resolves.toBeUndefined();
  });
});

// Last in this file: it kills a master of the file's cluster.
describe('readiness on a Redis Cluster after a failover', () => {
  it("retries a request's command about REQUEST_COMMAND_TIMEOUT_MS in all through a failover, and waits longer on other connections", async () => {
    const target = { clusterUrls: cluster.urls.split(',') };
    const request = openRequestRedis(target, uniqueName('request')) as Cluster;
    const commands = openRedis(target, uniqueName('commands')) as Cluster;
    try {
      const {
        maxRedirections = 0,
        retryDelayOnFailover = 0,
        retryDelayOnClusterDown = 0,
      } = request.options;
      expect(maxRedirections).toBe(REQUEST_REDIRECTIONS);
      expect(maxRedirections * Math.max(retryDelayOnFailover, retryDelayOnClusterDown)).toBe(
        REQUEST_COMMAND_TIMEOUT_MS,
      );
      expect(commands.options.maxRedirections).toBeGreaterThan(maxRedirections);
    } finally {
      request.disconnect();
      commands.disconnect();
    }
  });

  it('passes again once a replica took over, though the client sent nothing meanwhile', async () => {
    const redis = openRequestRedis({ clusterUrls: cluster.urls.split(',') }, uniqueName('idle'));
    try {
      await connected(redis);
      await pingEveryMaster(redis);
      const [victim] = await cluster.masters();
      const [replica] = await cluster.replicasOf(victim!.port);
      victim!.process.kill('SIGKILL');
      await until(
        async () => (await cluster.masters()).some((master) => master.port === replica!.port),
        `${replica!.port} master in place of ${victim!.port}`,
        30_000,
        100,
      );
      await cluster.waitHealthy(30_000);
      // Only readiness probes reach the client, as on a gateway nobody uses.
      await until(
        () =>
          pingEveryMaster(redis).then(
            () => true,
            () => false,
          ),
        'readiness after the failover',
        20_000,
        500,
      );
    } finally {
      redis.disconnect();
    }
  }, 90_000);
});
