import { setTimeout as sleep } from 'node:timers/promises';
import {
  LIVE_STATUSES,
  STARTABLE_STATUSES,
  ConcurrencyLimitError,
  HELD_SLOT,
  NO_CLUSTER_METRICS,
  NotFoundError,
  TOO_MANY_CONVERSATIONS_NOTICE,
  agentStateChangeDraft,
  claimsSlotBeforeStoring,
  readAgentStateChange,
  refOf,
  roomKey,
  storeUserAction,
  type AppendedEvent,
  type Attachment,
  type ClusterMetrics,
  type ConversationBroadcaster,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
  type SendOptions,
  type SlotClaim,
  type SlotOwner,
} from '@cs/core';
import { StatusId, type ConversationStatus, type UserAction } from '@cs/protocol';
import type { RedisConnection } from './redis/redis-connections.js';
import type { ConversationJobs } from './leases/conversation-jobs.js';
import type { ConversationInbox } from './leases/conversation-inbox.js';
import type { ConversationStops } from './leases/conversation-stops.js';
import { startAfterFinishingRun } from './leases/finishing-run.js';
import { unansweredMessages } from './leases/unanswered-messages.js';
import type { UserConcurrencyLimiter } from './limits/user-concurrency.limiter.js';
import type { ConnectionRegistry } from './realtime/connection-registry.js';
import { answeredInTime, assertConnected } from './redis/redis-connections.js';

const POLL_MS = 20;

/**
 * The gateway's view of the cluster. It never runs an agent: it stores user
 * events in Postgres first, then wakes the conversation's lease holder
 * through its Redis channel; when nobody holds the conversation it takes one
 * of the user's slots (Lua, across the cluster) and enqueues the
 * conversation's job, which a worker picks up as its lease.
 */
export class ClusteredConversationManager implements ConversationManager {
  constructor(
    private readonly deps: {
      store: ConversationStore;
      broadcaster: ConversationBroadcaster;
      jobs: ConversationJobs;
      inbox: ConversationInbox;
      /** Stops and evictions: a start does not start again past one (see `startAfterFinishingRun`). */
      stops: ConversationStops;
      limiter: UserConcurrencyLimiter;
      connections: ConnectionRegistry;
      limit: number;
      /** How long `stop` waits for the holder to stop (about the lease TTL). */
      stopTimeoutMs: number;
      /**
       * The connection the hand-offs use (`openRequestRedis`): while it is
       * down, a user action, or a create's first message, is refused
       * (`UNAVAILABLE`) before anything is stored.
       */
      redis?: Pick<RedisConnection, 'status'>;
      /** Where the per-user limit's evictions and refusals are counted. */
      metrics?: ClusterMetrics;
    },
  ) {}

  attach(attachment: Attachment): Promise<void> {
    return this.deps.connections.attach(attachment.connectionId, attachment.conversationId);
  }

  detach(connectionId: string): Promise<void> {
    return this.deps.connections.detach(connectionId);
  }

  connectionCount(conversationId: string): Promise<number> {
    return this.deps.connections.count(conversationId);
  }

  async ensureRunning(ref: ConversationRef): Promise<ConversationStatus> {
    // Read beside the slot's acquire, so that it adds no round trip (every connect comes here).
    const [stopMark] = await Promise.all([
      this.deps.stops.read(ref.conversationId),
      this.acquireSlot(ref),
    ]);
    // STARTING before the job exists: an eviction racing with this start settles
    // the status (to STOPPED) after it, never before, so it cannot be left STARTING.
    await this.deps.store.setStatus(
      ref.tenantId,
      ref.conversationId,
      'STARTING',
      STARTABLE_STATUSES,
    );
    const before = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    if (!before) throw new NotFoundError();
    await this.deps.jobs.start(ref);
    await startAfterFinishingRun(
      this.deps,
      ref,
      { leaseEpoch: before.leaseEpoch, stopMark },
      { acquireSlot: () => this.acquireSlot(ref), stopRun: () => this.stopRun(ref) },
    );
    const record = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    if (!record) throw new NotFoundError();
    return record.status === 'RUNNING' ? 'RUNNING' : 'STARTING';
  }

  async claimSlot(owner: SlotOwner): Promise<SlotClaim | null> {
    // A create's first message comes here before the create is stored.
    this.assertHandOffReachable();
    if (!claimsSlotBeforeStoring(this.deps.limiter.policy, true)) return null;
    return this.takeSlot(owner);
  }

  /**
   * A user action is stored first, then handed on. Under `reject` a message
   * takes its slot before (one Redis call), unless the caller read the
   * conversation RUNNING just now: the hot path stays one append, one publish.
   */
  async sendUserAction(
    ref: ConversationRef,
    action: UserAction,
    idempotencyKey?: string,
    options: SendOptions = {},
  ): Promise<AppendedEvent> {
    this.assertHandOffReachable();
    return storeUserAction(this.deps.store, ref, action, idempotencyKey, options, {
      policy: this.deps.limiter.policy,
      running: options.status === 'RUNNING',
      claimSlot: () => this.takeSlot(ref),
      ensureRunning: () => this.ensureRunning(ref),
      deliver: (appended, claimed) => this.deliver(ref, action, appended, claimed),
    });
  }

  /**
   * Stored, a user action is the holder's to answer, but only Redis hands it
   * on (a wake-up, a start): refused whole while Redis is away, it is neither
   * stored nor answered later, when the client may have sent it again.
   */
  private assertHandOffReachable(): void {
    if (this.deps.redis) assertConnected(this.deps.redis);
  }

  /** Publishes a stored user action and wakes its holder; with none, a message starts it. */
  private async deliver(
    ref: ConversationRef,
    action: UserAction,
    appended: AppendedEvent,
    claimed: boolean,
  ): Promise<void> {
    if (!appended.duplicate) this.deps.broadcaster.publishEvents(roomKey(ref), [appended.event]);
    const holders = appended.duplicate ? 0 : await this.wake(ref, appended);
    if (holders > 0 || action.action !== 'message') return;
    // Nobody holds it: a message starts it (a repeat too, in case the first start failed).
    if (!appended.duplicate || claimed) {
      await this.ensureRunning(ref);
      return;
    }
    const record = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    if (!record || record.status !== 'RUNNING') await this.ensureRunning(ref);
  }

  /**
   * Wakes the holder of a stored user action; resolves with how many heard it.
   * The wake-up may fail after the action is stored (a Redis Cluster master
   * failing over between the check before the write and the wake-up): a
   * conversation that some worker holds (RUNNING, read after the write)
   * finds the action by itself (its lost wake-up catch-up, the next holder's
   * start after a failover, or, when its session was closing, its run's look
   * once it has marked the conversation STOPPED: the action was stored
   * before that), so the request is answered as delivered rather than
   * refused with what it asked for stored, which a client would send again.
   * Anything else fails. (A status read before the write does not tell: the
   * run may have looked and stopped in between.)
   * On a cluster, ioredis retries a publish to a master that died until its
   * replica has taken over (seen: 5.4 s): the request waits for it at most
   * `REQUEST_COMMAND_TIMEOUT_MS`; a wake-up that lands later is harmless. (The
   * request connection's own bounds did not do it: a bench run with them alone
   * took 7.3 s p50 to answer the conversations on a killed master.)
   */
  private async wake(ref: ConversationRef, appended: AppendedEvent): Promise<number> {
    try {
      return await answeredInTime(
        this.deps.inbox.send(ref.conversationId, { type: 'wake', events: [appended.event] }),
      );
    } catch (error) {
      const record = await this.deps.store
        .getConversation(ref.tenantId, ref.conversationId)
        .catch(() => null);
      if (record?.status === 'RUNNING') return 1;
      throw error;
    }
  }

  /**
   * Takes the owner's slot before a write that will start the conversation
   * is stored. Given back (`release`) unless the owner's conversation has a
   * job: another request of theirs may have started it with this slot
   * meanwhile. A job of someone else's conversation of that id (a create
   * naming it, refused) keeps nothing.
   */
  private async takeSlot(owner: SlotOwner): Promise<SlotClaim> {
    const { jobs, limiter } = this.deps;
    const { tenantId, userId, conversationId } = owner;
    if ((await this.acquireSlot(owner)).held) return HELD_SLOT;
    let released = false;
    return {
      taken: true,
      release: async () => {
        if (released) return;
        released = true;
        if ((await jobs.state(conversationId)) !== null && (await this.owns(owner))) return;
        await limiter.release(tenantId, userId, conversationId);
      },
    };
  }

  /**
   * Takes the owner's slot (across the cluster): refused at the limit under
   * `reject` (CONCURRENCY_LIMIT_REACHED); under `evict_oldest` the
   * conversation evicted to make room is stopped. This gateway decided
   * either, so it counts it, once; the worker that stops the evicted one
   * does not. `held`: the conversation held the slot already.
   */
  private async acquireSlot(owner: SlotOwner): Promise<{ held: boolean }> {
    const { limiter, metrics = NO_CLUSTER_METRICS } = this.deps;
    const { tenantId, userId, conversationId } = owner;
    const slot = await limiter.acquire(tenantId, userId, conversationId);
    if (!slot.granted) {
      metrics.limitRejection();
      throw new ConcurrencyLimitError(this.deps.limit);
    }
    if (slot.evicted) {
      metrics.limitEviction();
      await this.evict({ tenantId, userId, conversationId: slot.evicted });
    }
    return { held: slot.held === true };
  }

  private async owns({ tenantId, userId, conversationId }: SlotOwner): Promise<boolean> {
    const record = await this.deps.store.getConversation(tenantId, conversationId);
    return record?.userId === userId;
  }

  /**
   * Stops the conversation and resolves once it has stopped: its job is gone,
   * so that a message sent next starts it again. A worker that is just taking
   * the job does not listen yet: the stop is sent again until it does.
   *
   * A message sent while the stop is under way reaches the holder that is
   * stopping (it listens, so its sender starts nothing) and is never answered
   * by it. It is a new request: once the run is gone, it starts the
   * conversation again, as it would have had it come a moment later. Messages
   * stored before the stop began (the turn it cut, those queued behind it)
   * are what the stop stops: they start nothing.
   */
  async stop(ref: ConversationRef): Promise<ConversationStatus> {
    const { store, stops } = this.deps;
    const [before] = await Promise.all([
      store.getConversation(ref.tenantId, ref.conversationId),
      stops.mark(ref.conversationId),
    ]);
    await this.stopRun(ref);
    const after = await store.getConversation(ref.tenantId, ref.conversationId);
    if (!after) throw new NotFoundError();
    if (before && after.status === 'STOPPED' && (await this.sentDuring(ref, before, after))) {
      try {
        return await this.ensureRunning(ref);
      } catch (error) {
        // The user has no slot free: it stays stopped, as a message sent a moment later would find it.
        if (error instanceof ConcurrencyLimitError) return after.status;
        throw error;
      }
    }
    return after.status;
  }

  /** Whether a user message stored after `before` (as the stop began) is still unanswered in `after`. */
  private async sentDuring(
    ref: ConversationRef,
    before: ConversationRecord,
    after: ConversationRecord,
  ): Promise<boolean> {
    // Nothing stored past both: no read (a stop of a conversation nobody held).
    if (after.lastEventId <= Math.max(before.lastEventId, after.answeredThrough)) return false;
    const sent = await unansweredMessages(this.deps.store, ref, {
      record: after,
      afterId: before.lastEventId,
    });
    return sent.length > 0;
  }

  /** Tells the holder, if any: it reads the settings again (nobody holds it: nothing to tell). */
  async settingsChanged(ref: ConversationRef): Promise<void> {
    await this.deps.inbox.send(ref.conversationId, { type: 'settings' });
  }

  /** Stops the conversation's run, held or queued, and waits for its job to go. */
  private async stopRun(ref: ConversationRef): Promise<void> {
    const { inbox, jobs } = this.deps;
    const deadline = Date.now() + this.deps.stopTimeoutMs;
    for (;;) {
      const holders = await inbox.send(ref.conversationId, { type: 'stop' });
      const state = await jobs.state(ref.conversationId);
      if (state === null || (holders === 0 && state !== 'active')) {
        if (holders === 0) await this.settleUnheld(ref);
        break;
      }
      if (Date.now() > deadline) break;
      await sleep(POLL_MS);
    }
  }

  async status(ref: ConversationRef): Promise<ConversationStatus> {
    const record = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    if (!record) throw new NotFoundError();
    return record.status;
  }

  listRunning(tenantId: string, userId: string): Promise<string[]> {
    return this.deps.limiter.running(tenantId, userId);
  }

  async runtime(ref: ConversationRef): Promise<{ workerId: string; leaseEpoch: number } | null> {
    const record = await this.deps.store.getConversation(ref.tenantId, ref.conversationId);
    if (!record || record.status !== 'RUNNING' || !record.leaseOwner) return null;
    return { workerId: record.leaseOwner, leaseEpoch: record.leaseEpoch };
  }

  async shutdown(): Promise<void> {
    await this.deps.connections.stop();
  }

  /** Stops a conversation evicted by `evict_oldest`, wherever it runs. */
  private async evict(key: Omit<ConversationRef, 'incarnation'>): Promise<void> {
    await this.deps.stops.mark(key.conversationId);
    const before = await this.deps.store.getConversation(key.tenantId, key.conversationId);
    if (!before) return; // deleted meanwhile: it holds no slot any more
    const victim = refOf(before);
    const holders = await this.deps.inbox.send(victim.conversationId, { type: 'evict' });
    if (holders === 0) {
      await this.settleUnheld(victim);
      await this.storeEvictionNotice(victim);
      return;
    }
    // Its holder stores the notice and stops; but a holder that was just starting
    // and found its slot already gone leaves without a word. Check once it has left.
    void this.noticeEvictionOnceLeft(victim, before.lastEventId).catch(() => undefined);
  }

  private async noticeEvictionOnceLeft(victim: ConversationRef, afterId: number): Promise<void> {
    const { jobs, store } = this.deps;
    const deadline = Date.now() + this.deps.stopTimeoutMs;
    while ((await jobs.state(victim.conversationId)) === 'active') {
      if (Date.now() > deadline) return; // still held: its holder answers for it
      await sleep(POLL_MS);
    }
    const since = await store.readEvents(victim.tenantId, victim.conversationId, {
      fromId: afterId + 1,
      limit: 1_000,
    });
    const noticed = since.some((event) => {
      const change = readAgentStateChange(event);
      return change?.agentState === 'stopped' && change.reason === StatusId.TooManyConversations;
    });
    if (!noticed) await this.storeEvictionNotice(victim);
  }

  /** Stores why the conversation stopped and tells its room. */
  private async storeEvictionNotice(victim: ConversationRef): Promise<void> {
    const [stopped] = await this.deps.store
      .append(
        victim.tenantId,
        victim.conversationId,
        [agentStateChangeDraft('stopped', { reason: StatusId.TooManyConversations })],
        { incarnation: victim.incarnation },
      )
      .catch(() => []);
    if (stopped) this.deps.broadcaster.publishEvents(roomKey(victim), [stopped.event]);
    this.deps.broadcaster.publishStatus(roomKey(victim), TOO_MANY_CONVERSATIONS_NOTICE);
  }

  /** A conversation nobody holds: drop its queued job, free its slot, mark it STOPPED. */
  private async settleUnheld(ref: ConversationRef): Promise<void> {
    await this.deps.jobs.cancelQueued(ref.conversationId);
    await this.deps.limiter.release(ref.tenantId, ref.userId, ref.conversationId);
    await this.deps.store.setStatus(ref.tenantId, ref.conversationId, 'STOPPED', LIVE_STATUSES);
  }
}
