// A second cluster of the same run, beside the main one: the same gateways,
// workers and options, on another Redis (a local Redis Cluster, or a private
// redis-server), so that a scenario measures both side by side. Its scenarios
// get a context of their own (its cluster, its tokens, no earlier results).
import { Cluster } from './cluster.mjs';
import { devToken } from './client.mjs';

/**
 * Starts the side cluster (`redis`: the Cluster's `redisCluster` and
 * `conversationQueues`, or `redis: { url, pid }`), runs `fn(sideCtx)`, stops it.
 */
export async function withSideCluster(ctx, redis, fn) {
  const cluster = new Cluster({ ...ctx.cluster.options, ...redis });
  try {
    await cluster.start();
    const tokens = new Map();
    const side = {
      ...ctx,
      cluster,
      results: {},
      upcoming: [],
      async token(userId) {
        if (!tokens.has(userId))
          tokens.set(userId, await devToken(cluster.gateways[0].url, userId, 'bench'));
        return tokens.get(userId);
      },
    };
    return await fn(side);
  } finally {
    await cluster.destroy();
  }
}
