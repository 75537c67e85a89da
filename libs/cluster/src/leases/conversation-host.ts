import type { ConnectionOptions, Worker } from 'bullmq';
import {
  NO_CLUSTER_METRICS,
  type AgentFactory,
  type ClusterMetrics,
  type ConversationStore,
  type SessionRuntime,
} from '@cs/core';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import type { UserConcurrencyLimiter } from '../limits/user-concurrency.limiter.js';
import type { ConnectionRegistry } from '../realtime/connection-registry.js';
import type { HolderBroadcaster } from '../realtime/redis-room.broadcaster.js';
import { LostWakeUpCatchUp } from './catch-up.js';
import type { ConversationInbox } from './conversation-inbox.js';
import { ConversationHeartbeat } from './conversation-heartbeat.js';
import type { ConversationJobData } from './conversation-jobs.js';
import { ConversationRun } from './conversation-run.js';
import { FailoverBreaker } from './failover-breaker.js';
import {
  describeError,
  liveConversations,
  type HostLog,
  type HostedConversation,
} from './hosted-conversation.js';
import { JobLeases, conversationWorker } from './job-lease.js';
import type { LeaseTiming } from './lease-timing.js';
import type { ScopedStateChannel } from './scoped-state-channel.js';

export { TOO_MANY_FAILOVERS } from './failover-breaker.js';

export interface ConversationHostOptions {
  workerId: string;
  concurrency: number;
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

/**
 * A worker's conversations. Each active BullMQ job of the conversation queue
 * is the lease of one conversation (`ConversationRun`: the processor bumps
 * the lease epoch in Postgres, restores the conversation into an
 * AgentSession and keeps the job active while the session runs). Each run
 * renews its job's lock (`JobLease`); when this process dies, the stalled
 * check hands the job to another worker, which resumes from Postgres with a
 * higher epoch that fences out any late write of this one. Beside the runs:
 * the heartbeat (slots, idle close) and the catch-up of lost wake-ups.
 */
export class ConversationHost {
  private readonly hosted = new Map<string, HostedConversation>();
  private readonly leases: JobLeases;
  private readonly breaker: FailoverBreaker;
  private readonly heartbeat: ConversationHeartbeat;
  private readonly catchUp: LostWakeUpCatchUp;
  private worker: Worker<ConversationJobData, string> | undefined;
  private draining = false;

  constructor(private readonly deps: ConversationHostDeps) {
    const { options, log } = deps;
    this.leases = new JobLeases(options.timing, (ids, tokens, duration) =>
      this.worker ? this.worker.extendJobLocks(ids, tokens, duration) : Promise.resolve(ids),
    );
    this.breaker = new FailoverBreaker(deps.redis, deps.keys, deps.store, {
      maxFailovers: options.maxFailovers,
      windowMs: options.failoverWindowMs,
    });
    this.heartbeat = new ConversationHeartbeat({
      limiter: deps.limiter,
      connections: deps.connections,
      hosted: this.hosted,
      idleTimeoutMs: options.idleTimeoutMs,
      log,
    });
    this.catchUp = new LostWakeUpCatchUp(deps.store, () => this.hosted.values(), log);
  }

  /** Conversations whose session runs here (what `/healthz` lists). */
  get conversations(): string[] {
    return [...this.hosted.values()]
      .filter((h) => h.session !== null)
      .map((h) => h.ref.conversationId);
  }

  get isDraining(): boolean {
    return this.draining;
  }

  start(): void {
    const { timing, concurrency } = this.deps.options;
    const context = {
      deps: this.deps,
      metrics: this.deps.metrics ?? NO_CLUSTER_METRICS,
      hosted: this.hosted,
      leases: this.leases,
      breaker: this.breaker,
      isDraining: () => this.draining,
    };
    this.worker = conversationWorker(
      (job, token) => new ConversationRun(context, job, token).execute(),
      {
        connection: this.deps.bullConnection,
        prefix: this.deps.keys.bullPrefix,
        concurrency,
        timing,
      },
    );
    this.worker.on('error', (error) => this.deps.log('warn', `queue: ${error.message}`));
    this.heartbeat.start(timing.heartbeatMs);
    this.catchUp.start();
    this.deps.scopedState
      .listen((change) => {
        for (const { session } of liveConversations(this.hosted.values()))
          session.scopedStateChanged(change);
      })
      .catch((error: unknown) =>
        this.deps.log('warn', `scoped state changes: ${describeError(error)}`),
      );
  }

  /**
   * SIGTERM: take no new conversations, close each session between steps,
   * and hand every lease back to the queue so that another worker resumes it
   * at once. Resolves when every job has been handed back.
   */
  async drain(): Promise<void> {
    if (this.draining) return;
    this.draining = true;
    await this.worker?.pause(true);
    for (const hosted of this.hosted.values()) hosted.handOff = true;
    await Promise.all(
      [...this.hosted.values()].map((hosted) => hosted.session?.close() ?? Promise.resolve()),
    );
    await this.worker?.close();
    // Only now: the slots stay renewed until every lease is handed back, so the next
    // holder finds them (a slot that lapsed would read as an eviction).
    this.heartbeat.stop();
    this.catchUp.stop();
    await this.deps.scopedState.unlisten().catch(() => undefined);
  }

  /** Stops at once (tests, fatal errors): the leases expire and move elsewhere. */
  async kill(): Promise<void> {
    this.heartbeat.stop();
    this.catchUp.stop();
    this.leases.releaseAll();
    await this.deps.scopedState.unlisten().catch(() => undefined);
    await this.worker?.close(true);
  }
}
