/**
 * What a worker's conversations need (`ConversationHost`) and share with each
 * of its runs (`ConversationRun`): its options and its connections.
 */
import type { ConnectionOptions } from 'bullmq';
import type { AgentFactory, ClusterMetrics, ConversationStore, SessionRuntime } from '@cs/core';
import type { UserConcurrencyLimiter } from '../limits/user-concurrency.limiter.js';
import type { ConnectionRegistry } from '../realtime/connection-registry.js';
import type { HolderBroadcaster } from '../realtime/redis-room.broadcaster.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ConversationInbox } from './conversation-inbox.js';
import type { HostLog } from './hosted-conversation.js';
import type { LeaseTiming } from './lease-timing.js';
import type { ScopedStateChannel } from './scoped-state-channel.js';

export interface ConversationHostOptions {
  workerId: string;
  /** Conversations this process hosts at once, over all the queues. */
  concurrency: number;
  /** `CONVERSATION_QUEUES` (default 1): this process consumes every one of them. */
  queueCount?: number;
  timing: LeaseTiming;
  idleTimeoutMs: number;
  maxIterations: number;
  /** More failovers than this within `failoverWindowMs` end the conversation in `error`. */
  maxFailovers: number;
  failoverWindowMs: number;
  /** Tools, metrics, budget, strategy and prices of every session. */
  runtime?: SessionRuntime;
}

export interface ConversationHostDeps {
  store: ConversationStore;
  agents: AgentFactory;
  broadcaster: HolderBroadcaster;
  inbox: ConversationInbox;
  /** Changes of `app:` and `user:` keys, to and from every worker. */
  scopedState: ScopedStateChannel;
  limiter: UserConcurrencyLimiter;
  connections: Pick<ConnectionRegistry, 'count'>;
  redis: RedisConnection;
  keys: ClusterKeys;
  bullConnection: ConnectionOptions;
  options: ConversationHostOptions;
  log: HostLog;
  /** Leases, failovers, hand-offs and wake-up pick-ups (`cs_*` metrics). */
  metrics?: ClusterMetrics;
}
