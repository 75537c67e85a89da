import type { Worker } from 'bullmq';
import { NO_CLUSTER_METRICS } from '@cs/core';
import { LostWakeUpCatchUp } from './catch-up.js';
import { ConversationHeartbeat } from './conversation-heartbeat.js';
import type { ConversationHostDeps } from './conversation-host.deps.js';
import type { ConversationJobData } from './conversation-jobs.js';
import { conversationQueueNames } from './conversation-queues.js';
import { ConversationRun, type ConversationRunContext } from './conversation-run.js';
import { FailoverBreaker } from './failover-breaker.js';
import { describeError, hostedSessions, type HostedConversation } from './hosted-conversation.js';
import { JobLeases, conversationWorker, handBack, type ConversationJob } from './job-lease.js';

export { TOO_MANY_FAILOVERS } from './failover-breaker.js';
export type { ConversationHostDeps, ConversationHostOptions } from './conversation-host.deps.js';

/**
 * A worker's conversations. Each active BullMQ job of a conversation queue
 * is the lease of one conversation (`ConversationRun`: the processor bumps
 * the lease epoch in Postgres, restores the conversation into an
 * AgentSession and keeps the job active while the session runs). Each run
 * renews its job's lock (`JobLease`); when this process dies, the stalled
 * check hands the job to another worker, which resumes from Postgres with a
 * higher epoch that fences out any late write of this one. Beside the runs:
 * the heartbeat (slots, idle close) and the catch-up of lost wake-ups.
 *
 * It consumes every queue (`CONVERSATION_QUEUES`), with a BullMQ Worker for
 * each (docs/design.md "Many queues" says why and what it costs). Each Worker
 * may take up to `concurrency` jobs, so that one queue can fill the process;
 * the process as a whole hosts at most `concurrency`: once full, its Workers
 * pause taking jobs, and a job one of them took meanwhile is handed back.
 */
export class ConversationHost {
  private readonly hosted = new Map<string, HostedConversation>();
  private readonly leases: JobLeases;
  private readonly breaker: FailoverBreaker;
  private readonly heartbeat: ConversationHeartbeat;
  private readonly catchUp: LostWakeUpCatchUp;
  /** By queue name. */
  private readonly workers = new Map<string, Worker<ConversationJobData, string>>();
  private draining = false;
  /** Jobs being processed here, handed back ones included until they are gone. */
  private runs = 0;
  /** Whether the Workers are paused because the process is full (`updateIntake`). */
  private intakePaused = false;
  private intake: Promise<void> = Promise.resolve();

  constructor(private readonly deps: ConversationHostDeps) {
    const { options, log } = deps;
    this.leases = new JobLeases(options.timing, (queueName, ids, tokens, duration) => {
      const worker = this.workers.get(queueName);
      return worker ? worker.extendJobLocks(ids, tokens, duration) : Promise.resolve(ids);
    });
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
    deps.inbox.onListenTrouble(() => this.catchUp.hurry());
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

  /** The queues this process consumes. */
  get queueNames(): string[] {
    return [...this.workers.keys()];
  }

  start(): void {
    const { timing, concurrency, queueCount = 1 } = this.deps.options;
    const context: ConversationRunContext = {
      deps: this.deps,
      metrics: this.deps.metrics ?? NO_CLUSTER_METRICS,
      hosted: this.hosted,
      leases: this.leases,
      breaker: this.breaker,
      isDraining: () => this.draining,
    };
    for (const queueName of conversationQueueNames(queueCount)) {
      const worker = conversationWorker(
        queueName,
        (job, token) => this.process(context, job, token),
        {
          connection: this.deps.bullConnection,
          prefix: this.deps.keys.bullPrefix,
          concurrency,
          timing,
        },
      );
      worker.on('error', (error) => this.deps.log('warn', `queue: ${error.message}`));
      this.workers.set(queueName, worker);
    }
    this.heartbeat.start(timing.heartbeatMs);
    this.catchUp.start();
    this.deps.scopedState
      .listen((change) => {
        for (const { session } of hostedSessions(this.hosted.values()))
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
    await this.intake; // a resume under way ends before the pause, not after it
    await Promise.all([...this.workers.values()].map((worker) => worker.pause(true)));
    for (const hosted of this.hosted.values()) hosted.handOff = true;
    await Promise.all(
      [...this.hosted.values()].map((hosted) => hosted.session?.close() ?? Promise.resolve()),
    );
    await Promise.all([...this.workers.values()].map((worker) => worker.close()));
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
    await Promise.all([...this.workers.values()].map((worker) => worker.close(true)));
  }

  /** One job of any queue: its run, unless the process is full. */
  private async process(
    context: ConversationRunContext,
    job: ConversationJob,
    token: string,
  ): Promise<string> {
    this.runs += 1;
    try {
      // Another queue's Worker took a job just before the Workers paused: let another worker have it.
      if (this.runs > this.deps.options.concurrency) return await handBack(job, token);
      this.updateIntake();
      return await new ConversationRun(context, job, token).execute();
    } finally {
      this.runs -= 1;
      this.updateIntake();
    }
  }

  /**
   * With several queues, pauses every Worker while the process hosts
   * `concurrency` conversations, and resumes them below. (With one queue, its
   * Worker's own concurrency is the cap, as it always was.) One change at a
   * time, in order: a resume must not overtake the pause before it.
   */
  private updateIntake(): void {
    if (this.workers.size <= 1) return;
    this.intake = this.intake
      .then(async () => {
        const full = this.runs >= this.deps.options.concurrency;
        if (this.draining || full === this.intakePaused) return;
        this.intakePaused = full;
        const workers = [...this.workers.values()];
        await Promise.all(workers.map((worker) => (full ? worker.pause(true) : worker.resume())));
      })
      .catch((error: unknown) => this.deps.log('warn', `queue: ${describeError(error)}`));
  }
}
