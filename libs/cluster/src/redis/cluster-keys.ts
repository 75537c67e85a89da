import { conversationOfRoom } from '@cs/core';

/**
 * Every Redis key and channel of a deployment, under `<KEY_PREFIX>:`, and
 * the slot plan of a Redis Cluster (docs/design.md "Redis keys and slots"):
 * keys and channels of one conversation share the hash tag `{<id>}`, keys of
 * one user the tag `{<tenant>/<user>}`, a tenant's budget `{tenant/<tenant>}`, the gateways' liveness keys the tag
 * `{gateways}` (one MGET reads them), the scoped-state channel its own
 * `{state}`; so that every script, transaction and multi-key command names
 * keys of one Redis Cluster slot, and a deployment's conversations and users
 * spread over every master. `cluster-keys.spec.ts` checks it.
 */
export class ClusterKeys {
  constructor(readonly prefix: string) {}

  /** BullMQ's prefix; the queue name carries the hash tag. */
  get bullPrefix(): string {
    return this.prefix;
  }

  /** How many conversation queues the deployment uses (`CONVERSATION_QUEUES`; `claimQueueCount`). */
  get conversationQueueCount(): string {
    return `${this.prefix}:{conversation-queues}:count`;
  }

  /** The Socket.IO adapter's key. */
  get socketIo(): string {
    return `${this.prefix}:socket.io`;
  }

  /**
   * The live traffic of a conversation's room (`roomKey`: its id and
   * incarnation) to the gateways with subscribers to it.
   */
  conversationRoom(room: string): string {
    return `${this.prefix}:room:{${conversationOfRoom(room)}}:${room}`;
  }

  /** Wake-ups and control messages for the conversation's lease holder. */
  conversationChannel(conversationId: string): string {
    return `${this.prefix}:conv:{${conversationId}}:inbox`;
  }

  /** Every worker listens: a conversation stored `app:` or `user:` keys (`ScopedStateChannel`). */
  get scopedStateChanges(): string {
    return `${this.prefix}:{state}:changes`;
  }

  /**
   * Held by the worker whose reconciler runs the current pass
   * (`LostJobReconciler`); in a slot of its own.
   */
  get reconcilerLock(): string {
    return `${this.prefix}:{reconciler}:lock`;
  }

  /** Connections per gateway attached to the conversation (a hash gateway → count). */
  conversationConnections(conversationId: string): string {
    return `${this.prefix}:conv:{${conversationId}}:connections`;
  }

  /** Recent failovers of the conversation (a sorted set of times). */
  conversationFailovers(conversationId: string): string {
    return `${this.prefix}:conv:{${conversationId}}:failovers`;
  }

  /** Stops and evictions of the conversation (a counter; `ConversationStops`). */
  conversationStops(conversationId: string): string {
    return `${this.prefix}:conv:{${conversationId}}:stops`;
  }

  /** The user's running conversations, scored by last activity. */
  userRunning(tenantId: string, userId: string): string {
    return `${this.prefix}:user:{${userTag(tenantId, userId)}}:running`;
  }

  /** When each of the user's slots expires unless its holder renews it. */
  userSlotExpiry(tenantId: string, userId: string): string {
    return `${this.prefix}:user:{${userTag(tenantId, userId)}}:expiry`;
  }

  /** The user's stored user actions in the last minute (rate limit). */
  userActions(tenantId: string, userId: string): string {
    return `${this.prefix}:user:{${userTag(tenantId, userId)}}:actions`;
  }

  /** The user's model budget of one UTC day (`hold-budget-1`, `settle-budget-1`). */
  userBudget(tenantId: string, userId: string, day: string): string {
    return `${this.prefix}:user:{${userTag(tenantId, userId)}}:budget:${day}`;
  }

  /** The tenant's model budget of one UTC month (`YYYY-MM`), in a slot of the tenant's own. */
  tenantBudget(tenantId: string, month: string): string {
    return `${this.prefix}:tenant:{tenant/${encodeURIComponent(tenantId)}}:budget:${month}`;
  }

  /**
   * Taken for one sweep interval by the process that applies retention
   * (`RedisTickLock`): one process of the deployment sweeps at a time.
   */
  get retentionSweep(): string {
    return `${this.prefix}:{lifecycle}:retention-sweep`;
  }

  /**
   * Present while the gateway is alive (expires unless renewed). Every
   * gateway's under one tag: `ConnectionRegistry.count` reads them in one MGET.
   */
  gatewayAlive(gatewayId: string): string {
    return `${this.prefix}:{gateways}:${gatewayId}:alive`;
  }
}

/** Tenant and user ids may hold any character: encode them so `}` cannot end the tag. */
function userTag(tenantId: string, userId: string): string {
  return `${encodeURIComponent(tenantId)}/${encodeURIComponent(userId)}`;
}
