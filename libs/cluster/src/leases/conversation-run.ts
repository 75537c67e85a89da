import {
  LIVE_STATUSES,
  AgentSession,
  LeaseLostError,
  agentStateChangeDraft,
  roomKey,
  type AgentSpec,
  type ClusterMetrics,
  type ConversationRef,
  type SessionEndReason,
} from '@cs/core';
import type { ConversationHostDeps } from './conversation-host.deps.js';
import { TOO_MANY_FAILOVERS, type FailoverBreaker } from './failover-breaker.js';
import {
  deliverToHosted,
  describeError,
  idsOf,
  type HostedConversation,
} from './hosted-conversation.js';
import { handBack, type ConversationJob, type JobLease, type JobLeases } from './job-lease.js';
import { hasUnansweredMessage, unansweredMessages } from './unanswered-messages.js';

/** What a run shares with its host and the other runs. */
export interface ConversationRunContext {
  deps: ConversationHostDeps;
  metrics: ClusterMetrics;
  /** The conversations held here, by id: a run registers its own entry. */
  hosted: Map<string, HostedConversation>;
  leases: JobLeases;
  breaker: FailoverBreaker;
  isDraining: () => boolean;
}

/**
 * One run of a conversation's job, as long as it holds the lease: it bumps
 * the lease epoch in Postgres, restores the conversation into an
 * AgentSession and keeps the job active while the session runs (its lock
 * renewed by this run, `JobLease`). It ends with the session for good
 * (stopped, evicted, idle, deleted, in error), or hands the job back on
 * SIGTERM.
 */
export class ConversationRun {
  private readonly hosted: HostedConversation;

  constructor(
    private readonly context: ConversationRunContext,
    private readonly job: ConversationJob,
    private readonly token: string,
  ) {
    const { data } = job;
    const ref: ConversationRef = {
      tenantId: data.tenantId,
      userId: data.userId,
      conversationId: data.conversationId,
      incarnation: data.incarnation,
    };
    this.hosted = { ref, session: null, epoch: 0, handOff: false, pending: null, leaseLost: false };
  }

  /** Runs the job; resolves with its outcome, or throws BullMQ's `WaitingError` when handed back. */
  async execute(): Promise<string> {
    const { job, token, context } = this;
    // From the job's creation (a start) to a worker picking it up.
    if (job.attemptsStarted <= 1)
      context.metrics.wakeupPickedUp((Date.now() - job.timestamp) / 1000);
    if (context.isDraining()) return handBack(job, token);
    const lease = context.leases.hold(job, token, {
      onLockLost: () => void this.checkLease(),
      onError: (error) => context.deps.log('warn', `queue: ${describeError(error)}`),
    });
    try {
      return await this.holdJob(lease);
    } finally {
      lease.release();
    }
  }

  private async holdJob(lease: JobLease): Promise<string> {
    const { hosted } = this;
    const { ref } = hosted;
    const { store, inbox, options, limiter, broadcaster } = this.context.deps;
    const id = ref.conversationId;
    const record = await store.getConversation(ref.tenantId, id);
    // Gone, or deleted and its id used again: this job was for the one that went.
    if (!record || record.incarnation !== ref.incarnation) return 'deleted';
    // BullMQ hands a job to the worker that held it before when it stalled (this
    // process was paused, or Redis was away, past the lock): that earlier run lost
    // its lease and must end, and must not tear down this run's entry on its way out.
    const earlier = this.context.hosted.get(id);
    if (earlier) {
      earlier.leaseLost = true;
      await earlier.session?.close();
    }
    let previousHolderCrashed = record.leaseOwner !== null;

    let outcome: SessionEndReason | 'failed' | 'evicted';
    /** Marked STOPPED after the last session's end (the look again, below). */
    let stopped: boolean;
    for (;;) {
      stopped = false;
      this.context.hosted.set(id, hosted);
      // A drain that began since this run last looked did not see it among the
      // hosted: it hands the conversation back as soon as its session starts.
      if (this.context.isDraining()) hosted.handOff = true;
      await inbox.listen(id, (message) => {
        // A gateway opened the room mid-step: it gets the text so far.
        if (message.type === 'catch_up') broadcaster.publishCatchUp(roomKey(ref));
        else deliverToHosted(hosted, message);
      });
      try {
        // Subscribed first: from here on an eviction reaches this run through the inbox.
        outcome = (await this.holdsSlot(previousHolderCrashed))
          ? await this.hold(previousHolderCrashed, record.agent)
          : 'evicted';
      } finally {
        if (this.context.hosted.get(id) === hosted) {
          this.context.hosted.delete(id);
          await inbox.unlisten(id).catch(() => undefined);
        }
      }
      if (!(await this.closedWithMessageToAnswer(outcome))) {
        if (!this.closedOnItsOwn(outcome)) break;
        await store.setStatus(ref.tenantId, id, 'STOPPED', LIVE_STATUSES);
        stopped = true;
        if (!(await this.stoppedWithMessageToAnswer())) break;
      }
      previousHolderCrashed = false;
    }

    if (outcome === 'evicted') {
      // Its evictor stored the notice; the slot belongs to others now.
      await store.setStatus(ref.tenantId, id, 'STOPPED', LIVE_STATUSES);
      return outcome;
    }
    if (outcome === 'lease_lost' || hosted.leaseLost) return 'lease_lost'; // a newer holder has it, slot and all
    if (hosted.handOff) {
      this.context.metrics.handoff();
      await store.releaseLease(ref.tenantId, id, options.workerId, hosted.epoch);
      return lease.handBack();
    }
    await limiter.release(ref.tenantId, ref.userId, id);
    if (outcome !== 'failed' && !stopped) {
      await store.setStatus(ref.tenantId, id, 'STOPPED', LIVE_STATUSES);
    }
    await store.releaseLease(ref.tenantId, id, options.workerId, hosted.epoch);
    return outcome;
  }

  /**
   * A session that closed on its own (idle) leaves a message stored meanwhile
   * unanswered: its gateway woke this run, which still listened, so it
   * started nothing. Looked for only once this run no longer listens, so
   * that a message stored after the look found nobody listening and its
   * gateway starts the conversation itself; one stored before is answered
   * here, by a new session.
   */
  private async closedWithMessageToAnswer(outcome: string): Promise<boolean> {
    if (!this.closedOnItsOwn(outcome)) return false;
    return hasUnansweredMessage(this.context.deps.store, this.hosted.ref);
  }

  /**
   * The look again once the conversation is marked STOPPED, for a message
   * stored after the first look by a gateway that still read it RUNNING and
   * whose wake-up failed (Redis failing): that gateway took this run for the
   * one to answer it and started nothing. A message stored after the mark
   * is the gateway's to start, and found here too when it came first: this
   * run then answers it, under a new lease epoch, and that start, watching
   * this run finish, starts nothing.
   */
  private async stoppedWithMessageToAnswer(): Promise<boolean> {
    if (this.hosted.leaseLost) return false;
    return hasUnansweredMessage(this.context.deps.store, this.hosted.ref);
  }

  /** The session closed by itself (idle), with nothing else taking the conversation over. */
  private closedOnItsOwn(outcome: string): boolean {
    const { hosted, context } = this;
    return outcome === 'closed' && !hosted.handOff && !hosted.leaseLost && !context.isDraining();
  }

  /**
   * Whether the conversation may run here: it must hold one of its user's
   * slots. A start overtaken by an eviction (or a stop) before any worker held
   * the conversation leaves a job whose slot is gone; running it would exceed
   * the user's limit. A holder that crashed stopped renewing its slot, which
   * may have expired before this takeover: take a free one back then, evicting
   * nobody.
   */
  private async holdsSlot(previousHolderCrashed: boolean): Promise<boolean> {
    const { limiter } = this.context.deps;
    const { tenantId, userId, conversationId } = this.hosted.ref;
    if (await limiter.holds(tenantId, userId, conversationId)) return true;
    return previousHolderCrashed && (await limiter.reclaim(tenantId, userId, conversationId));
  }

  /** Takes the lease and runs a session until it ends. */
  private async hold(
    previousHolderCrashed: boolean,
    agent: AgentSpec,
  ): Promise<SessionEndReason | 'failed'> {
    const { hosted, context } = this;
    const { ref } = hosted;
    const { store, options, log } = context.deps;
    try {
      // A holder that left without handing the lease back crashed: count it
      // against what it was doing, if that was this conversation's work.
      if (previousHolderCrashed && (await context.breaker.tripsOnCrash(ref))) {
        await this.endInError(TOO_MANY_FAILOVERS);
        return 'failed';
      }
      hosted.epoch = await store.acquireLease(ref.tenantId, ref.conversationId, options.workerId);
      context.metrics.leaseAcquired();
      if (previousHolderCrashed) context.metrics.failover();
      const outcome = await this.runSession(agent);
      if (outcome === 'start_failed') {
        await this.endInError('start_failed');
        return 'failed';
      }
      return outcome;
    } catch (error) {
      if (error instanceof LeaseLostError) return 'lease_lost';
      log('error', `conversation ${ref.conversationId}: ${describeError(error)}`, idsOf(hosted));
      await this.endInError('start_failed').catch(() => undefined);
      return 'failed';
    }
  }

  private async runSession(agentSpec: AgentSpec): Promise<SessionEndReason> {
    const { hosted } = this;
    const { store, broadcaster, agents, options, log, scopedState } = this.context.deps;
    const session = new AgentSession({
      store,
      broadcaster,
      ref: hosted.ref,
      leaseEpoch: hosted.epoch,
      agent: agents.create(agentSpec),
      // Wake-ups come through Redis; the host's `LostWakeUpCatchUp` covers those lost during an outage.
      options: {
        ...options.runtime,
        maxIterations: options.maxIterations,
        catchUpIntervalMs: 0,
        reportError: (message, error) => log('warn', `${message}: ${String(error)}`, idsOf(hosted)),
        onScopedStateChange: (change) => {
          options.runtime?.onScopedStateChange?.(change);
          scopedState.publish(change);
        },
      },
    });
    hosted.session = session;
    try {
      await session.start();
    } catch {
      return session.closed;
    }
    await store.setStatus(hosted.ref.tenantId, hosted.ref.conversationId, 'RUNNING');
    if (hosted.pending) deliverToHosted(hosted, hosted.pending);
    if (hosted.handOff) void session.close();
    return session.closed;
  }

  /**
   * This run's job lock could not be renewed: another worker may have taken
   * the conversation (this process was paused past its lease), or Redis only
   * blinked. Postgres' lease epoch tells which: a newer holder ends the session.
   */
  private async checkLease(): Promise<void> {
    const { hosted, context } = this;
    const { ref } = hosted;
    const { store, log } = context.deps;
    log('warn', `queue: could not renew lock for job ${this.job.id ?? '?'}`, idsOf(hosted));
    // Only the current run of the conversation: an earlier one has ended its session already.
    if (context.hosted.get(ref.conversationId) !== hosted) return;
    try {
      const record = await store.getConversation(ref.tenantId, ref.conversationId);
      if (record && record.leaseEpoch === hosted.epoch) return;
      log(
        'warn',
        `lease of ${ref.conversationId} was taken over: closing its session`,
        idsOf(hosted),
      );
      hosted.leaseLost = true;
      await hosted.session?.close();
    } catch (error) {
      log('warn', `lease check: ${describeError(error)}`);
    }
  }

  /** Ends the conversation in `error` (it starts again with the next user message). */
  private async endInError(reason: string): Promise<void> {
    const { hosted } = this;
    const { ref } = hosted;
    const { store, broadcaster, options } = this.context.deps;
    // The message its holders died on is answered by the error: it is not run again.
    const [oldest] = await unansweredMessages(store, ref);
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
}
