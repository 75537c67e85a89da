/**
 * StandaloneConversationManager: runs every conversation's AgentSession in
 * this process (the standalone app). The clustered manager in `libs/cluster`
 * has the same contract and leases conversations to workers instead.
 *
 * One live entry per conversation (starting or running). The per-user limit
 * is decided under a per-user mutex (`UserSlots`) that only reserves slots
 * and marks the conversations to evict; every slow step (stopping the evicted,
 * starting the new session) happens after the mutex is released, so that no
 * request waits behind another user's start and the idle cleanup never
 * blocks anyone.
 * Under `reject` a slot may be reserved before the write that starts the
 * conversation is stored (`claimSlot`): the reservation counts against the
 * limit until the start turns it into the live entry, or it is released.
 */
import type { ConcurrencyPolicy, ConversationStatus, StatusUpdate, UserAction } from '@cs/protocol';
import type { AgentFactory } from '../agent.js';
import {
  AgentSession,
  SessionClosedError,
  type SessionEndReason,
  type SessionRuntime,
} from '../agent-session.js';
import { ConnectionCounts } from './connection-counts.js';
import { roomKey, type ConversationRef } from '../conversation.js';
import {
  TOO_MANY_CONVERSATIONS,
  TOO_MANY_CONVERSATIONS_NOTICE,
  claimsSlotBeforeStoring,
  isIdleSince,
  type SlotClaim,
  type SlotOwner,
} from '../conversation-limits.js';
import type { Attachment, ConversationManager, SendOptions } from '../conversation-manager.js';
import { NotFoundError, UnavailableError } from '../errors.js';
import { newStandaloneHostEntry, type StandaloneHostEntry } from './standalone-host-entry.js';
import type { ConversationBroadcaster } from '../ports/broadcaster.port.js';
import { NO_CLUSTER_METRICS, type ClusterMetrics } from '../ports/cluster-metrics.port.js';
import { StatusWrites } from './status-writes.js';
import { storeUserAction } from '../user-action.js';
import { UserSlots, userKeyOf } from './user-slots.js';
import { systemClock, type Clock } from '../ports/clock.port.js';
import type { AppendedEvent, ConversationStore } from '../ports/conversation-store.port.js';
import type { ScopedStateChange } from '../state.js';

export interface StandaloneConversationManagerOptions {
  /** Running (or starting) conversations per user (per tenant). */
  maxConcurrentConversations: number;
  concurrencyPolicy: ConcurrencyPolicy;
  /** A conversation with no client attached and its agent idle for longer is closed. */
  idleTimeoutMs: number;
  /** Passed to each AgentSession. */
  maxIterations: number;
  /** This process's lease owner name (`conversations.lease_owner`, `runtime.worker_id`). */
  ownerId: string;
  /** How often idle conversations are looked for. */
  cleanupIntervalMs: number;
  /** Passed to each AgentSession (default 1000 ms). */
  catchUpIntervalMs?: number;
  /** Tools, metrics, budget, strategy and prices of every session. */
  runtime?: SessionRuntime;
}

export interface StandaloneConversationManagerDeps {
  store: ConversationStore;
  broadcaster: ConversationBroadcaster;
  agents: AgentFactory;
  clock?: Clock;
  options: StandaloneConversationManagerOptions;
  /** Where the per-user limit's evictions and refusals are counted. */
  metrics?: ClusterMetrics;
  /**
   * Where failures that no caller awaits are reported (a status write, a
   * close); `fields` name the conversation when there is one (its log fields).
   */
  reportError?: (message: string, error: unknown, fields?: ConversationLogFields) => void;
}

/** The log fields of a conversation (docs/protocol.md "Operations"). */
export interface ConversationLogFields {
  conversation_id: string;
  tenant_id: string;
  user_id: string;
}

export class StandaloneConversationManager implements ConversationManager {
  private readonly store: ConversationStore;
  private readonly broadcaster: ConversationBroadcaster;
  private readonly agents: AgentFactory;
  private readonly clock: Clock;
  private readonly options: StandaloneConversationManagerOptions;
  private readonly reportError: (
    message: string,
    error: unknown,
    fields?: ConversationLogFields,
  ) => void;
  private readonly metrics: ClusterMetrics;

  private readonly live = new Map<string, StandaloneHostEntry>();
  private readonly slots: UserSlots;
  private readonly connections = new ConnectionCounts();
  private readonly statusWrites: StatusWrites;
  private readonly cleanupTimer: { cancel(): void };
  private seq = 0;
  private shuttingDown = false;

  constructor(deps: StandaloneConversationManagerDeps) {
    this.store = deps.store;
    this.broadcaster = deps.broadcaster;
    this.agents = deps.agents;
    this.clock = deps.clock ?? systemClock;
    this.options = deps.options;
    this.reportError = deps.reportError ?? (() => undefined);
    this.metrics = deps.metrics ?? NO_CLUSTER_METRICS;
    this.slots = new UserSlots({
      live: this.live,
      limits: this.options,
      assertOpen: () => this.assertOpen(),
      metrics: this.metrics,
    });
    this.statusWrites = new StatusWrites(this.store, this.reportError);
    this.cleanupTimer = this.clock.setInterval(
      () => this.closeIdleConversations(),
      this.options.cleanupIntervalMs,
    );
  }

  // ---------------------------------------------------------------- connections

  attach(attachment: Attachment): Promise<void> {
    this.connections.attach(attachment.connectionId, attachment.conversationId);
    return Promise.resolve();
  }

  detach(connectionId: string): Promise<void> {
    this.connections.detach(connectionId);
    return Promise.resolve();
  }

  connectionCount(conversationId: string): Promise<number> {
    return Promise.resolve(this.connections.count(conversationId));
  }

  // ---------------------------------------------------------------- running

  async ensureRunning(ref: ConversationRef): Promise<ConversationStatus> {
    this.assertOpen();
    for (;;) {
      const current = this.live.get(ref.conversationId);
      if (current?.stopping) {
        await current.done;
        continue;
      }
      const entry = current ?? (await this.claim(ref));
      if (!entry) continue;
      try {
        await entry.ready;
      } catch (error) {
        if (error instanceof SessionClosedError) return this.status(ref);
        throw error;
      }
      return this.live.get(ref.conversationId) === entry && !entry.stopping
        ? entry.phase === 'running'
          ? 'RUNNING'
          : 'STARTING'
        : this.status(ref);
    }
  }

  claimSlot(owner: SlotOwner): Promise<SlotClaim | null> {
    if (!claimsSlotBeforeStoring(this.options.concurrencyPolicy, true))
      return Promise.resolve(null);
    return this.slots.reserve(owner);
  }

  async sendUserAction(
    ref: ConversationRef,
    action: UserAction,
    idempotencyKey?: string,
    options: SendOptions = {},
  ): Promise<AppendedEvent> {
    this.assertOpen();
    const current = this.live.get(ref.conversationId);
    return storeUserAction(this.store, ref, action, idempotencyKey, options, {
      policy: this.options.concurrencyPolicy,
      running: current !== undefined && !current.stopping,
      claimSlot: () => this.slots.reserve(ref),
      ensureRunning: () => this.ensureRunning(ref),
      deliver: (appended, claimed) => this.deliver(ref, action, appended, claimed),
    });
  }

  /** Publishes a stored user action and hands it to the agent, starting it for a message. */
  private async deliver(
    ref: ConversationRef,
    action: UserAction,
    appended: AppendedEvent,
    claimed: boolean,
  ): Promise<void> {
    if (!appended.duplicate) {
      this.broadcaster.publishEvents(roomKey(ref), [appended.event]);
    }
    const entry = this.live.get(ref.conversationId);
    if (entry && !entry.stopping) {
      // A starting session reads the event when its loop begins.
      if (!appended.duplicate) entry.session?.wake([appended.event]);
    } else if (action.action === 'message' && (!appended.duplicate || !entry || claimed)) {
      // A repeat starts the agent only if the first attempt's start did not.
      await this.ensureRunning(ref);
    }
  }

  async stop(ref: ConversationRef): Promise<ConversationStatus> {
    const entry = this.live.get(ref.conversationId);
    if (entry) await this.stopEntry(entry);
    return this.status(ref);
  }

  settingsChanged(ref: ConversationRef): Promise<void> {
    this.live.get(ref.conversationId)?.session?.settingsChanged();
    return Promise.resolve();
  }

  async status(ref: ConversationRef): Promise<ConversationStatus> {
    const entry = this.live.get(ref.conversationId);
    if (entry) return entry.phase === 'running' ? 'RUNNING' : 'STARTING';
    const record = await this.store.getConversation(ref.tenantId, ref.conversationId);
    if (!record) throw new NotFoundError();
    return record.status === 'ERROR' ? 'ERROR' : 'STOPPED';
  }

  /** Conversations starting or running in this process (a metrics gauge). */
  get runningCount(): number {
    let count = 0;
    for (const entry of this.live.values()) if (!entry.stopping) count += 1;
    return count;
  }

  listRunning(tenantId: string, userId: string): Promise<string[]> {
    const mine = this.slots.liveOf(userKeyOf({ tenantId, userId }));
    return Promise.resolve(mine.map((entry) => entry.ref.conversationId));
  }

  runtime(ref: ConversationRef): Promise<{ workerId: string; leaseEpoch: number } | null> {
    const entry = this.live.get(ref.conversationId);
    const session = entry?.phase === 'running' ? entry.session : null;
    return Promise.resolve(
      session ? { workerId: this.options.ownerId, leaseEpoch: session.leaseEpoch } : null,
    );
  }

  /** Closes every session without storing `stopped`; each ends STOPPED. Unfinished turns run again at the next start. */
  async shutdown(): Promise<void> {
    this.shuttingDown = true;
    this.cleanupTimer.cancel();
    await Promise.all([...this.live.values()].map((entry) => this.closeEntry(entry)));
    await this.statusWrites.settled();
  }

  // ---------------------------------------------------------------- internals

  /**
   * Claims a slot for `ref` under its user's mutex and starts the new entry
   * after the mutex is released. Returns null when the conversation is being
   * stopped: the caller waits and retries.
   */
  private async claim(ref: ConversationRef): Promise<StandaloneHostEntry | null> {
    const claimed = await this.slots.claim(ref, (userKey) =>
      newStandaloneHostEntry(ref, userKey, this.seq++, this.clock.now()),
    );
    if (claimed.created && claimed.entry) void this.startEntry(claimed.entry, claimed.evicted);
    return claimed.entry;
  }

  /** Stops the evicted, then starts the session: acquire a lease, restore, run. */
  private async startEntry(
    entry: StandaloneHostEntry,
    evicted: StandaloneHostEntry[],
  ): Promise<void> {
    const { ref } = entry;
    try {
      await Promise.all(evicted.map((victim) => this.evict(victim)));
      await this.statusWrites.persist(ref, () =>
        this.live.get(ref.conversationId) === entry ? 'STARTING' : null,
      );
      const record = await this.store.getConversation(ref.tenantId, ref.conversationId);
      if (!record) throw new NotFoundError();
      const agent = this.agents.create(record.agent);
      const leaseEpoch = await this.store.acquireLease(
        ref.tenantId,
        ref.conversationId,
        this.options.ownerId,
      );
      this.metrics.leaseAcquired();
      const session = new AgentSession({
        store: this.store,
        broadcaster: this.broadcaster,
        ref,
        leaseEpoch,
        agent,
        options: {
          ...this.options.runtime,
          maxIterations: this.options.maxIterations,
          clock: this.clock,
          reportError: (message, error) =>
            this.reportError(message, error, {
              conversation_id: ref.conversationId,
              tenant_id: ref.tenantId,
              user_id: ref.userId,
            }),
          onScopedStateChange: (change) => {
            this.options.runtime?.onScopedStateChange?.(change);
            this.scopedStateChanged(change);
          },
          ...(this.options.catchUpIntervalMs === undefined
            ? {}
            : { catchUpIntervalMs: this.options.catchUpIntervalMs }),
        },
      });
      entry.session = session;
      await session.start();
      entry.phase = 'running';
      await this.statusWrites.persist(ref, () =>
        this.live.get(ref.conversationId) === entry && !entry.stopping && !session.isClosed
          ? 'RUNNING'
          : null,
      );
      void session.closed.then((reason) => this.onSessionClosed(entry, reason));
      entry.settleReady.resolve();
    } catch (error) {
      const closedEarly = error instanceof SessionClosedError;
      this.remove(entry, closedEarly ? 'STOPPED' : 'ERROR');
      entry.settleReady.reject(error);
    }
  }

  /** A session stored `app:` or `user:` keys: each other session here decides if it shares them. */
  private scopedStateChanged(change: ScopedStateChange): void {
    for (const entry of this.live.values()) entry.session?.scopedStateChanged(change);
  }

  private onSessionClosed(entry: StandaloneHostEntry, reason: SessionEndReason): void {
    // A lost lease means a newer holder runs it: its status is not ours to write.
    this.remove(entry, reason === 'lease_lost' ? null : 'STOPPED');
  }

  /** Drops the entry (if still current) and persists its final status, then resolves `done`. */
  private remove(entry: StandaloneHostEntry, finalStatus: ConversationStatus | null): void {
    entry.stopping = true;
    const id = entry.ref.conversationId;
    if (this.live.get(id) === entry) this.live.delete(id);
    const write = finalStatus
      ? this.statusWrites.persist(entry.ref, () => (this.live.has(id) ? null : finalStatus))
      : Promise.resolve();
    void write.then(entry.resolveDone);
  }

  private async evict(victim: StandaloneHostEntry): Promise<void> {
    await this.stopEntry(victim, TOO_MANY_CONVERSATIONS, TOO_MANY_CONVERSATIONS_NOTICE);
  }

  /** Waits for the start to settle, stores `stopped` (with a reason) and waits until gone. */
  private async stopEntry(
    entry: StandaloneHostEntry,
    reason?: string,
    notice?: StatusUpdate,
  ): Promise<void> {
    entry.stopping = true;
    await entry.ready.catch(() => undefined);
    if (entry.session && !entry.session.isClosed) await entry.session.stop(reason, notice);
    else if (notice) this.broadcaster.publishStatus(roomKey(entry.ref), notice);
    await entry.done;
  }

  /** Closes without storing anything (idle close, shutdown). */
  private async closeEntry(entry: StandaloneHostEntry): Promise<void> {
    entry.stopping = true;
    await entry.ready.catch(() => undefined);
    await entry.session?.close();
    await entry.done;
  }

  /** Runs on the cleanup interval; starts closes and returns at once. */
  private closeIdleConversations(): void {
    const now = this.clock.now();
    for (const entry of this.live.values()) {
      const session = entry.session;
      if (entry.stopping || entry.phase !== 'running' || !session) continue;
      if (this.connections.count(entry.ref.conversationId) > 0) continue;
      if (session.isMidTurn || !isIdleSince(session.lastActivity, now, this.options.idleTimeoutMs))
        continue;
      this.closeEntry(entry).catch((error: unknown) =>
        this.reportError('idle close failed', error),
      );
    }
  }

  private assertOpen(): void {
    if (this.shuttingDown) throw new UnavailableError('the service is shutting down');
  }
}
