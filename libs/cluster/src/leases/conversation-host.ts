import { WaitingError, type ConnectionOptions, type Job } from 'bullmq';
import {
  AgentSession,
  LeaseLostError,
  NO_CLUSTER_METRICS,
  type ClusterMetrics,
  type SessionRuntime,
  agentStateChangeDraft,
  roomKey,
  type AgentFactory,
  type ConversationBroadcaster,
  type ConversationRef,
  type ConversationStore,
  type AgentSpec,
  type SessionEndReason,
} from '@cs/core';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { TOO_MANY_CONVERSATIONS_NOTICE } from '../clustered-conversation-manager.js';
import type { UserConcurrencyLimiter } from '../limits/user-concurrency.limiter.js';
import type { ConnectionRegistry } from '../realtime/connection-registry.js';
import { isAction, type InboxMessage } from '@cs/protocol';
import type { ConversationInbox } from './conversation-inbox.js';
import {
  CONVERSATION_QUEUE,
  conversationJobId,
  type ConversationJobData,
} from './conversation-jobs.js';
import type { LeaseTiming } from './lease-timing.js';
import { ConversationWorker } from './conversation-worker.js';

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
  broadcaster: ConversationBroadcaster;
  inbox: ConversationInbox;
  limiter: UserConcurrencyLimiter;
  connections: Pick<ConnectionRegistry, 'count'>;
  redis: Redis;
  keys: ClusterKeys;
  bullConnection: ConnectionOptions;
  options: ConversationHostOptions;
  log: (level: 'log' | 'warn' | 'error', message: string, fields?: Record<string, unknown>) => void;
  /** Leases, failovers, hand-offs and wake-up pick-ups (`cs_*` metrics). */
  metrics?: ClusterMetrics;
}

/** A conversation this worker holds: its job is active here, its lease epoch current. */
interface HostedConversation {
  ref: ConversationRef;
  session: AgentSession | null;
  epoch: number;
  /** Set on SIGTERM: hand the lease back instead of finishing the job. */
  handOff: boolean;
  /** A stop or eviction that arrived before the session was ready. */
  pending: InboxMessage | null;
  /** A newer holder took the lease: leave its slot and status alone. */
  leaseLost: boolean;
}

export const TOO_MANY_FAILOVERS = 'too_many_failovers';
const CATCH_UP_INTERVAL_MS = 3_000;

/**
 * A worker's conversations. Each active BullMQ job of the conversation queue
 * is the lease of one conversation: the processor bumps the lease epoch in
 * Postgres, restores the conversation into an AgentSession and keeps the job
 * active while the session runs. BullMQ renews the job's lock; when this
 * process dies, the stalled check hands the job to another worker, which
 * resumes from Postgres with a higher epoch that fences out any late write of
 * this one.
 */
export class ConversationHost {
  private readonly hosted = new Map<string, HostedConversation>();
  private worker: ConversationWorker | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  private catchUpTimer: NodeJS.Timeout | undefined;
  private draining = false;

  constructor(private readonly deps: ConversationHostDeps) {}

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
    this.worker = new ConversationWorker(
      CONVERSATION_QUEUE,
      (job, token) => this.process(job, token),
      {
        connection: this.deps.bullConnection,
        prefix: this.deps.keys.bullPrefix,
        concurrency,
        lockDuration: timing.lockDuration,
        lockRenewTime: timing.lockRenewTime,
        stalledInterval: timing.stalledInterval,
        // Repeated crashes are bounded by our failover accounting, not by failing the job for good.
        maxStalledCount: Number.MAX_SAFE_INTEGER,
        // An idle worker looks for jobs at least this often (seconds): a worker shutting
        // down may take the wake-up marker of the jobs it hands back, and the others must
        // not wait for the next one.
        drainDelay: 0.2,
      },
    );
    this.worker.on('error', (error) => this.deps.log('warn', `queue: ${error.message}`));
    this.worker.on('lockRenewalFailed', (jobIds) => void this.checkLeases(jobIds));
    this.heartbeat = setInterval(() => void this.beat(), timing.heartbeatMs);
    this.heartbeat.unref();
    this.catchUpTimer = setInterval(() => void this.catchUp(), CATCH_UP_INTERVAL_MS);
    this.catchUpTimer.unref();
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
    clearInterval(this.heartbeat);
    clearInterval(this.catchUpTimer);
  }

  /** Stops at once (tests, fatal errors): the leases expire and move elsewhere. */
  async kill(): Promise<void> {
    clearInterval(this.heartbeat);
    clearInterval(this.catchUpTimer);
    await this.worker?.close(true);
  }

  private get metrics(): ClusterMetrics {
    return this.deps.metrics ?? NO_CLUSTER_METRICS;
  }

  private async process(job: Job<ConversationJobData>, token: string | undefined): Promise<string> {
    const ref: ConversationRef = {
      tenantId: job.data.tenantId,
      userId: job.data.userId,
      conversationId: job.data.conversationId,
      incarnation: job.data.incarnation,
    };
    const { store, inbox, options } = this.deps;
    const id = ref.conversationId;
    // From the job's creation (a start) to a worker picking it up.
    if (job.attemptsStarted <= 1) this.metrics.wakeupPickedUp((Date.now() - job.timestamp) / 1000);
    if (this.draining && token) {
      await job.moveToWait(token);
      throw new WaitingError();
    }
    const record = await store.getConversation(ref.tenantId, id);
    // Gone, or deleted and its id used again: this job was for the one that went.
    if (!record || record.incarnation !== ref.incarnation) return 'deleted';
    // BullMQ hands a job to the worker that held it before when it stalled (this
    // process was paused, or Redis was away, past the lock): that earlier run lost
    // its lease and must end, and must not tear down this run's entry on its way out.
    const earlier = this.hosted.get(id);
    if (earlier) {
      earlier.leaseLost = true;
      await earlier.session?.close();
    }
    const previousHolderCrashed = record.leaseOwner !== null;

    const hosted: HostedConversation = {
      ref,
      session: null,
      epoch: 0,
      handOff: false,
      pending: null,
      leaseLost: false,
    };
    this.hosted.set(id, hosted);
    await inbox.listen(id, (message) => this.onInbox(hosted, message));
    let outcome: SessionEndReason | 'failed' | 'evicted';
    try {
      // Subscribed first: from here on an eviction reaches this run through the inbox.
      outcome = (await this.holdsSlot(ref, previousHolderCrashed))
        ? await this.hold(hosted, previousHolderCrashed, record.agent)
        : 'evicted';
    } finally {
      if (this.hosted.get(id) === hosted) {
        this.hosted.delete(id);
        await inbox.unlisten(id).catch(() => undefined);
      }
    }

    if (outcome === 'evicted') {
      // Its evictor stored the notice; the slot belongs to others now.
      await store.setStatus(ref.tenantId, id, 'STOPPED', ['STARTING', 'RUNNING']);
      return outcome;
    }
    if (outcome === 'lease_lost' || hosted.leaseLost) return 'lease_lost'; // a newer holder has it, slot and all
    if (hosted.handOff && token) {
      this.metrics.handoff();
      await store.releaseLease(ref.tenantId, id, options.workerId, hosted.epoch);
      await job.moveToWait(token);
      throw new WaitingError();
    }
    await this.deps.limiter.release(ref.tenantId, ref.userId, id);
    if (outcome !== 'failed')
      await store.setStatus(ref.tenantId, id, 'STOPPED', ['STARTING', 'RUNNING']);
    await store.releaseLease(ref.tenantId, id, options.workerId, hosted.epoch);
    return outcome;
  }

  /**
   * Whether the conversation may run here: it must hold one of its user's
   * slots. A start overtaken by an eviction (or a stop) before any worker held
   * the conversation leaves a job whose slot is gone; running it would exceed
   * the user's limit. A holder that crashed stopped renewing its slot, which
   * may have expired before this takeover: take a free one back then, evicting
   * nobody.
   */
  private async holdsSlot(ref: ConversationRef, previousHolderCrashed: boolean): Promise<boolean> {
    const { limiter } = this.deps;
    if (await limiter.holds(ref.tenantId, ref.userId, ref.conversationId)) return true;
    return (
      previousHolderCrashed && (await limiter.reclaim(ref.tenantId, ref.userId, ref.conversationId))
    );
  }

  /** Takes the lease and runs sessions until one ends for good. */
  private async hold(
    hosted: HostedConversation,
    previousHolderCrashed: boolean,
    agent: AgentSpec,
  ): Promise<SessionEndReason | 'failed'> {
    const { ref } = hosted;
    try {
      // A holder that left without handing the lease back crashed: count it
      // against what it was doing, if that was this conversation's work.
      if (previousHolderCrashed && (await this.tooManyFailovers(ref))) {
        await this.endInError(hosted, TOO_MANY_FAILOVERS);
        return 'failed';
      }
      hosted.epoch = await this.deps.store.acquireLease(
        ref.tenantId,
        ref.conversationId,
        this.deps.options.workerId,
      );
      this.metrics.leaseAcquired();
      if (previousHolderCrashed) this.metrics.failover();
      for (;;) {
        const outcome = await this.runSession(hosted, agent);
        if (outcome === 'start_failed') {
          await this.endInError(hosted, 'start_failed');
          return 'failed';
        }
        // A message stored while the session was closing must still be answered.
        if (outcome !== 'closed' || hosted.handOff || hosted.leaseLost || this.draining)
          return outcome;
        if (!(await this.hasUnansweredMessage(ref))) return outcome;
      }
    } catch (error) {
      if (error instanceof LeaseLostError) return 'lease_lost';
      this.deps.log(
        'error',
        `conversation ${ref.conversationId}: ${describe(error)}`,
        idsOf(hosted),
      );
      await this.endInError(hosted, 'start_failed').catch(() => undefined);
      return 'failed';
    }
  }

  private async runSession(
    hosted: HostedConversation,
    agentSpec: AgentSpec,
  ): Promise<SessionEndReason> {
    const { store, broadcaster, agents, options } = this.deps;
    const session = new AgentSession({
      store,
      broadcaster,
      ref: hosted.ref,
      leaseEpoch: hosted.epoch,
      agent: agents.create(agentSpec),
      // Wake-ups come through Redis; `catchUp` covers those lost during an outage.
      options: {
        ...options.runtime,
        maxIterations: options.maxIterations,
        catchUpIntervalMs: 0,
        reportError: (message, error) =>
          this.deps.log('warn', `${message}: ${String(error)}`, idsOf(hosted)),
      },
    });
    hosted.session = session;
    try {
      await session.start();
    } catch {
      return session.closed;
    }
    await store.setStatus(hosted.ref.tenantId, hosted.ref.conversationId, 'RUNNING');
    if (hosted.pending) this.onInbox(hosted, hosted.pending);
    if (hosted.handOff) void session.close();
    return session.closed;
  }

  private onInbox(hosted: HostedConversation, message: InboxMessage): void {
    const session = hosted.session;
    if (message.type === 'wake') {
      session?.wake(message.events);
      return;
    }
    if (!session) {
      hosted.pending = message;
      return;
    }
    if (message.type === 'evict') {
      void session.stop(TOO_MANY_CONVERSATIONS_NOTICE.id, TOO_MANY_CONVERSATIONS_NOTICE);
    } else {
      void session.stop();
    }
  }

  /**
   * A job lock that could not be renewed may mean that another worker took the
   * conversation (this process was paused past its lease), or only that Redis
   * blinked. Postgres' lease epoch tells which: a newer holder ends the session.
   */
  private async checkLeases(jobIds: string[]): Promise<void> {
    for (const hosted of this.hosted.values()) {
      if (!jobIds.includes(conversationJobId(hosted.ref.conversationId))) continue;
      try {
        const record = await this.deps.store.getConversation(
          hosted.ref.tenantId,
          hosted.ref.conversationId,
        );
        if (record && record.leaseEpoch === hosted.epoch) continue;
        this.deps.log(
          'warn',
          `lease of ${hosted.ref.conversationId} was taken over: closing its session`,
          idsOf(hosted),
        );
        hosted.leaseLost = true;
        await hosted.session?.close();
      } catch (error) {
        this.deps.log('warn', `lease check: ${describe(error)}`);
      }
    }
  }

  /** Renews the slots of the conversations held here, and closes idle ones. */
  private async beat(): Promise<void> {
    const live = [...this.hosted.values()].filter((h) => h.session && !h.session.isClosed);
    try {
      const lost = await this.deps.limiter.renew(
        live.map((h) => ({ ...h.ref, lastActivity: h.session!.lastActivity })),
      );
      for (const id of lost) {
        const hosted = this.hosted.get(id);
        if (hosted?.session) await this.onSlotLost(hosted);
      }
      await Promise.all(
        live.map(async (hosted) => {
          if (await this.isIdle(hosted)) await hosted.session?.close();
        }),
      );
    } catch (error) {
      this.deps.log('warn', `heartbeat: ${describe(error)}`);
    }
  }

  /**
   * A held conversation whose slot is gone: an eviction whose message is on
   * its way, or Redis lost the slot (restarted without persistence). It takes
   * a free slot back, evicting nobody; with none free its user has too many
   * conversations running, and it stops as if evicted.
   */
  private async onSlotLost(hosted: HostedConversation): Promise<void> {
    const { tenantId, userId, conversationId } = hosted.ref;
    if (await this.deps.limiter.reclaim(tenantId, userId, conversationId)) {
      this.deps.log(
        'warn',
        `slot of ${conversationId} was lost: took a free one back`,
        idsOf(hosted),
      );
      return;
    }
    this.deps.log(
      'warn',
      `slot of ${conversationId} was taken, and none is free: stopping it`,
      idsOf(hosted),
    );
    this.onInbox(hosted, { type: 'evict' });
  }

  /**
   * A wake-up lost (Redis away, a holder just subscribing) must delay a
   * message, never lose it: one read of every hosted conversation's last
   * event id finds the sessions that are behind, and only those read. A
   * session that failed to write (Postgres away) is woken to try again.
   */
  private async catchUp(): Promise<void> {
    const live = [...this.hosted.values()].filter((h) => h.session && !h.session.isClosed);
    if (live.length === 0) return;
    try {
      const latest = await this.deps.store.lastEventIds(live.map((hosted) => hosted.ref));
      for (const hosted of live) {
        const last = latest.get(hosted.ref.conversationId);
        const session = hosted.session!;
        if (session.wantsRetry || (last !== undefined && last > session.lastEventId))
          session.wake();
      }
    } catch (error) {
      this.deps.log('warn', `catch-up: ${describe(error)}`);
    }
  }

  private async isIdle(hosted: HostedConversation): Promise<boolean> {
    const session = hosted.session;
    if (!session || session.isMidTurn) return false;
    if (Date.now() - session.lastActivity < this.deps.options.idleTimeoutMs) return false;
    return (await this.deps.connections.count(hosted.ref.conversationId)) === 0;
  }

  /**
   * The circuit breaker against a conversation that crashes its workers (a
   * message its agent dies on, a history too big to load): more than
   * `maxFailovers` crashed holders within `failoverWindowMs` while doing the
   * same thing end it in `error`. What a holder was doing is read from
   * Postgres: answering the oldest unanswered message, or loading. A holder
   * that died while the conversation sat idle, or on a message that the next
   * holder answered, says nothing about the conversation: workers killed or
   * paused for other reasons do not add up against it.
   */
  private async tooManyFailovers(ref: ConversationRef): Promise<boolean> {
    const work = await this.workAtCrash(ref);
    if (work === null) return false;
    const { redis, keys, options } = this.deps;
    const key = keys.conversationFailovers(ref.conversationId);
    const now = Date.now();
    const [, , members] = (await redis
      .multi()
      .zremrangebyscore(key, '-inf', String(now - options.failoverWindowMs))
      .zadd(key, String(now), `${work}|${now}-${Math.random()}`)
      .zrange(key, '0', '-1')
      .pexpire(key, options.failoverWindowMs)
      .exec()) as Array<[Error | null, unknown]>;
    const crashes = ((members?.[1] ?? []) as string[]).filter((m) => m.startsWith(`${work}|`));
    return crashes.length > options.maxFailovers;
  }

  /** `message:<id>` (the oldest unanswered user message), `loading`, or null (idle). */
  private async workAtCrash(ref: ConversationRef): Promise<string | null> {
    const pending = await this.unansweredMessages(ref);
    if (pending.length > 0) return `message:${Math.min(...pending)}`;
    const record = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    return record?.agentState === 'loading' ? 'loading' : null;
  }

  /** Ends the conversation in `error` (it starts again with the next user message). */
  private async endInError(hosted: HostedConversation, reason: string): Promise<void> {
    const { store, broadcaster, options } = this.deps;
    const { ref } = hosted;
    // The message its holders died on is answered by the error: it is not run again.
    const [oldest] = await this.unansweredMessages(ref);
    hosted.epoch = await store.acquireLease(ref.tenantId, ref.conversationId, options.workerId);
    const appended = await store.append(
      ref.tenantId,
      ref.conversationId,
      [
        agentStateChangeDraft('error', {
          reason,
          ...(oldest === undefined ? {} : { cause: oldest, answers: oldest }),
        }),
      ],
      { leaseEpoch: hosted.epoch, incarnation: ref.incarnation },
    );
    broadcaster.publishEvents(
      roomKey(ref),
      appended.map((a) => a.event),
    );
    await store.setStatus(ref.tenantId, ref.conversationId, 'ERROR');
  }

  /** True when the newest user message has no settled answer after it. */
  private async hasUnansweredMessage(ref: ConversationRef): Promise<boolean> {
    return (await this.unansweredMessages(ref)).length > 0;
  }

  /**
   * Ids of the user messages after `answered_through` (the first 100 events
   * after it): the ones its session has yet to answer.
   */
  private async unansweredMessages(ref: ConversationRef): Promise<number[]> {
    const { store } = this.deps;
    const record = await store.getConversation(ref.tenantId, ref.conversationId);
    if (!record) return [];
    const after = await store.readEvents(ref.tenantId, ref.conversationId, {
      fromId: record.answeredThrough + 1,
      limit: 100,
    });
    return after.flatMap((event) =>
      event.source === 'user' && isAction(event) && event.action === 'message' ? [event.id] : [],
    );
  }
}

/** The ids of PROTOCOL.md "Operations" on every log line about a conversation. */
function idsOf(hosted: HostedConversation): Record<string, unknown> {
  return {
    conversation_id: hosted.ref.conversationId,
    tenant_id: hosted.ref.tenantId,
    user_id: hosted.ref.userId,
    lease_epoch: hosted.epoch,
  };
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
