import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * Clients attached to each conversation, counted across all gateways without a
 * keyspace SCAN: a hash per conversation (gateway id → count) and a liveness
 * key per gateway, so that a crashed gateway's connections stop counting once
 * its liveness key expires.
 */
export class ConnectionRegistry {
  private readonly local = new Map<string, string>(); // connection id → conversation id
  private readonly counts = new Map<string, number>(); // conversation id → local count
  private heartbeat: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly gatewayId: string,
    private readonly livenessTtlMs: number,
  ) {}

  /** Starts renewing this gateway's liveness key. */
  async start(): Promise<void> {
    await this.beat();
    this.heartbeat = setInterval(
      () => void this.beat().catch(() => undefined),
      this.livenessTtlMs / 3,
    );
    this.heartbeat.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.heartbeat);
    const conversations = [...this.counts.keys()];
    this.local.clear();
    this.counts.clear();
    // Plain commands, not one pipeline: the conversations' keys live in
    // different slots of a Redis Cluster (ioredis pipelines them per node).
    await Promise.all([
      ...conversations.map((id) =>
        this.redis.hdel(this.keys.conversationConnections(id), this.gatewayId),
      ),
      this.redis.del(this.keys.gatewayAlive(this.gatewayId)),
    ]);
  }

  async attach(connectionId: string, conversationId: string): Promise<void> {
    this.local.set(connectionId, conversationId);
    const count = (this.counts.get(conversationId) ?? 0) + 1;
    this.counts.set(conversationId, count);
    await this.redis.hset(this.keys.conversationConnections(conversationId), this.gatewayId, count);
  }

  async detach(connectionId: string): Promise<void> {
    const conversationId = this.local.get(connectionId);
    if (conversationId === undefined) return;
    this.local.delete(connectionId);
    const count = (this.counts.get(conversationId) ?? 1) - 1;
    const key = this.keys.conversationConnections(conversationId);
    if (count <= 0) {
      this.counts.delete(conversationId);
      await this.redis.hdel(key, this.gatewayId);
    } else {
      this.counts.set(conversationId, count);
      await this.redis.hset(key, this.gatewayId, count);
    }
  }

  /** Connections to the conversation on every live gateway. */
  async count(conversationId: string): Promise<number> {
    const perGateway = await this.redis.hgetall(this.keys.conversationConnections(conversationId));
    const gateways = Object.keys(perGateway);
    if (gateways.length === 0) return 0;
    const alive = await this.redis.mget(gateways.map((id) => this.keys.gatewayAlive(id)));
    let total = 0;
    gateways.forEach((id, index) => {
      if (alive[index] !== null) total += Number(perGateway[id]) || 0;
    });
    return total;
  }

  private async beat(): Promise<void> {
    await this.redis.set(this.keys.gatewayAlive(this.gatewayId), '1', 'PX', this.livenessTtlMs);
  }
}
