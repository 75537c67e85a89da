/**
 * AgentSession: the agent loop of one running conversation, on exactly one
 * process (the holder of the conversation's lease).
 *
 * It reads user events from the store after those already answered, applies
 * control actions (stop, pause, resume, a confirmation) as they come, and
 * runs each message as a turn of steps (`session/turn-runner.ts`), one after
 * another; a message sent while a turn runs waits, interrupts it, or was
 * refused at the door (`multitask_strategy`). Every append carries the
 * session's lease epoch: a session that lost its lease stops at once and
 * writes nothing more.
 *
 * Exactly-once answers: a turn's last batch holds its answer and the state
 * change that settles it, which also moves the conversation's
 * `answered_through` up to the message; a crash anywhere in a turn leaves
 * either both or neither, and a new holder resumes the turn from its stored
 * events. Restoring reads the conversation row and the events after
 * `answered_through`: the work still pending, never the whole history.
 *
 * Its parts, under `session/`: the lifecycle (`session-lifecycle`), the
 * loop's waits (`wake-signal`), what is read and still to handle
 * (`user-event-queue`, `event-reader`), the turns (`turn-driver`, one
 * `active-turn` at a time, each a `turn-runner` of `step-runner` steps
 * reading `turn-history`), titles (`conversation-title`).
 */
import type { AgentState, MultitaskStrategy, StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent } from './agent.js';
import {
  roomKey,
  type ConversationRecord,
  type ConversationRef,
  type EventDraft,
} from './conversation.js';
import { LeaseLostError, NotFoundError } from './errors.js';
import type { ConversationBroadcaster } from './ports/broadcaster.port.js';
import { systemClock, type Clock } from './ports/clock.port.js';
import type { ConversationStore } from './ports/conversation-store.port.js';
import { NO_TRACING, type Tracing } from './ports/tracing.port.js';
import {
  agentStateChangeDraft,
  readAgentStateChange,
  settledStateAfter,
} from './session/agent-state-change.js';
import { EventReader } from './session/event-reader.js';
import { SessionLifecycle, type SessionEndReason } from './session/session-lifecycle.js';
import type { AgentSessionInit, AgentSessionOptions } from './session/session-options.js';
import { SessionState } from './session/session-state.js';
import { STOPPED_WHY, TurnDriver } from './session/turn-driver.js';
import { RecentEvents } from './session/turn-history.js';
import { UserEventQueue, type Control } from './session/user-event-queue.js';
import { WakeSignal } from './session/wake-signal.js';
import { outdatesScopes, scopedStateChangeOf, type ScopedStateChange } from './state.js';
import { BUILTIN_TOOLS } from './tools/builtin-tools.js';
import { ToolRegistry } from './tools/tool-registry.js';

export { AGENT_FAILED_MESSAGE } from './session/turn-runner.js';
export type { SessionEndReason } from './session/session-lifecycle.js';
export type {
  AgentSessionInit,
  AgentSessionOptions,
  SessionRuntime,
} from './session/session-options.js';

/** `start()` rejects with this when the session was stopped or closed before it was ready. */
export class SessionClosedError extends Error {
  constructor(message = 'the session was closed before it was ready') {
    super(message);
    this.name = 'SessionClosedError';
  }
}

/** Internal: a write attempted after closing began. Never escapes the session. */
class ClosingSignal extends Error {}

const DEFAULT_CATCH_UP_MS = 1000;
const DEFAULT_PAGE_SIZE = 500;
export { OUTPUT_REFUSED_MESSAGE, STORE_FAILED_MESSAGE } from './session/turn-driver.js';

export class AgentSession {
  readonly ref: ConversationRef;
  /** The room its live traffic goes to (`roomKey` of its ref). */
  readonly room: string;
  readonly leaseEpoch: number;
  /** Resolves (never rejects) once the session can write no more, with why it ended. */
  readonly closed: Promise<SessionEndReason>;

  private readonly store: ConversationStore;
  private readonly broadcaster: ConversationBroadcaster;
  private readonly agent: Agent;
  private readonly options: AgentSessionOptions;
  private readonly clock: Clock;
  private readonly tools: ToolRegistry;
  private readonly catchUpMs: number;
  private readonly reportError: (message: string, error: unknown) => void;
  private readonly tracing: Tracing;
  private readonly cache = new RecentEvents();
  private readonly queue: UserEventQueue;
  private readonly reader: EventReader;
  private readonly wakeSignal = new WakeSignal();
  private readonly lifecycle: SessionLifecycle;
  private readonly turns: TurnDriver;

  private record: ConversationRecord | null = null;
  private readonly state = new SessionState();
  private currentState: AgentState | null = null;
  private activityAt: number;
  /** Id of this session's `loading` event: what was stored before it, a new holder resumes. */
  private loadingEventId = -1;
  private error: unknown = null;
  private retryWanted = false;
  private failures = 0;
  private startPromise: Promise<void> | null = null;
  private loopPromise: Promise<void> = Promise.resolve();
  private poll: { cancel(): void } | null = null;

  constructor(init: AgentSessionInit) {
    this.store = init.store;
    this.broadcaster = init.broadcaster;
    this.ref = { ...init.ref };
    this.room = roomKey(init.ref);
    this.leaseEpoch = init.leaseEpoch;
    this.agent = init.agent;
    this.options = init.options;
    this.clock = init.options.clock ?? systemClock;
    this.tools = init.options.tools ?? defaultTools();
    this.tracing = init.options.tracing ?? NO_TRACING;
    this.catchUpMs = init.options.catchUpIntervalMs ?? DEFAULT_CATCH_UP_MS;
    this.reportError = init.options.reportError ?? (() => undefined);
    this.activityAt = this.clock.now();
    this.queue = new UserEventQueue(this.cache, () => {
      this.activityAt = this.clock.now();
    });
    this.lifecycle = new SessionLifecycle(() => {
      this.poll?.cancel();
      this.turns.cut('close');
      this.wakeSignal.releaseAll();
    });
    this.reader = new EventReader(
      this.store,
      this.ref,
      this.queue,
      init.options.readPageSize ?? DEFAULT_PAGE_SIZE,
      () => this.lifecycle.isFinished,
    );
    this.closed = this.lifecycle.closed;
    const onEnd = init.options.onEnd;
    if (onEnd) void this.closed.then((reason) => onEnd(this.ref, reason));
    const publish = (status: StatusUpdate) =>
      this.safely(() => this.broadcaster.publishStatus(this.room, status));
    this.turns = new TurnDriver({
      store: this.store,
      ref: this.ref,
      agent: this.agent,
      options: this.options,
      tools: this.tools,
      tracing: this.tracing,
      cache: this.cache,
      queue: this.queue,
      reader: this.reader,
      write: (drafts, final) => this.write(drafts, final),
      publishStatus: publish,
      publishStream: (delta) => this.safely(() => this.broadcaster.publishStream(this.room, delta)),
      reportError: this.reportError,
      record: () => this.record,
      state: () => this.state.current,
      refreshState: () => this.refreshSharedState(),
      agentState: () => this.currentState,
      strategy: () => this.strategy,
      loadingEventId: () => this.loadingEventId,
      wakeRaised: () => this.wakeSignal.isRaised,
      isClosing: () => this.lifecycle.isClosing,
    });
  }

  /** What a message sent while a turn runs does (the conversation's, else the deployment's). */
  private get strategy(): MultitaskStrategy {
    return this.record?.settings.multitaskStrategy ?? this.options.multitaskStrategy ?? 'enqueue';
  }

  get conversationId(): string {
    return this.ref.conversationId;
  }

  get agentState(): AgentState | null {
    return this.currentState;
  }

  get lastActivity(): number {
    return this.activityAt;
  }

  /** Id of the newest event this session has (read or written); -1 before any. */
  get lastEventId(): number {
    return this.queue.lastEventId;
  }

  get isMidTurn(): boolean {
    return this.turns.isRunning;
  }

  get isClosed(): boolean {
    return this.lifecycle.isFinished;
  }

  get sessionState(): Readonly<Record<string, unknown>> {
    return this.state.current;
  }

  /** True while the loop waits to try again after a store failure (its holder may wake it). */
  get wantsRetry(): boolean {
    return this.retryWanted;
  }

  get lastError(): unknown {
    return this.error;
  }

  /**
   * Stores `loading`, restores the pending work and state, stores
   * `awaiting_user_input` (or `paused`) and resolves; pending user events are
   * then processed in the background.
   */
  start(): Promise<void> {
    this.startPromise ??= this.boot();
    return this.startPromise;
  }

  /**
   * A hint that new user events were stored. Cheap; safe to call at any time.
   * With the stored events themselves, the session reads nothing when they
   * follow on from what it has.
   */
  wake(events?: readonly StoredEvent[]): void {
    if (this.lifecycle.isClosing) return;
    // The wake-up arrives in its message's trace: the turn continues it.
    const trace = events ? this.tracing.currentTraceparent() : undefined;
    if (trace && events) this.turns.rememberTrace(trace, events);
    if (!events || !this.queue.accept(events)) this.reader.markUnread();
    this.wakeSignal.raise();
    if (this.turns.isRunning) void this.turns.checkForInterruption();
  }

  /**
   * Another conversation stored `app:` or `user:` keys: when this one shares
   * them, they are read again before its next step. Cheap; safe at any time.
   */
  scopedStateChanged(change: ScopedStateChange): void {
    const { tenantId, userId, conversationId } = this.ref;
    const appName = this.record?.appName ?? null;
    if (outdatesScopes(change, { id: conversationId, tenantId, userId, appName }))
      this.state.markStale();
  }

  /**
   * Stops the agent: a running step is cut (its partial text stored as
   * interrupted), a turn awaiting confirmation ends (a stop is not a
   * failover: its calls are answered that they never ran), `notice` goes to
   * the room, `stopped` is stored (with `extras.reason` if given) and the
   * session closes.
   */
  async stop(reason?: string, notice?: StatusUpdate): Promise<void> {
    const { lifecycle } = this;
    if (lifecycle.shutdownRequested || lifecycle.isFinished) {
      await this.closed;
      return;
    }
    lifecycle.shutdownRequested = true;
    this.turns.markCut('stop');
    lifecycle.beginClosing();
    if (notice) this.safely(() => this.broadcaster.publishStatus(this.room, notice));
    await this.quiesce();
    if (lifecycle.isWritable && this.loadingEventId >= 0 && this.currentState !== 'stopped') {
      try {
        await this.turns.endSuspended(STOPPED_WHY, true);
        await this.write(
          [agentStateChangeDraft('stopped', reason === undefined ? {} : { reason })],
          true,
        );
      } catch (error) {
        if (!(error instanceof LeaseLostError)) this.error = error;
      }
    }
    lifecycle.finish(lifecycle.endReason ?? 'stopped');
  }

  /**
   * Closes without writing (shutdown, idle close, lease hand-off): a running
   * turn is cut and left as stored, so the next holder goes on with it.
   */
  async close(): Promise<void> {
    const { lifecycle } = this;
    if (!lifecycle.shutdownRequested && !lifecycle.isFinished) {
      lifecycle.shutdownRequested = true;
      lifecycle.endWith('closed');
      lifecycle.beginClosing();
      await this.quiesce();
      lifecycle.finish(lifecycle.endReason ?? 'closed');
    }
    await this.closed;
  }

  // ---------------------------------------------------------------- start

  private async boot(): Promise<void> {
    const { lifecycle } = this;
    try {
      if (lifecycle.isClosing) throw new ClosingSignal();
      // Read before `loading` is stored: the state before this run (paused?).
      const snapshot = await this.store.getSnapshot(this.ref.tenantId, this.ref.conversationId);
      if (!snapshot || snapshot.conversation.incarnation !== this.ref.incarnation)
        throw new NotFoundError();
      this.record = snapshot.conversation;
      this.state.load(snapshot.state);
      if (snapshot.conversation.title === '') this.turns.untitled();
      const previous = await this.stateBefore(snapshot.conversation);
      // Everything up to `answered_through` is settled: only what follows is read.
      this.queue.startAfter(snapshot.conversation.answeredThrough);
      const [loading] = await this.write([agentStateChangeDraft('loading')]);
      this.loadingEventId = loading?.id ?? -1;
      await this.reader.sync();
      await this.write([agentStateChangeDraft(settledStateAfter(previous))]);
    } catch (error) {
      if (error instanceof LeaseLostError) lifecycle.loseLease();
      if (!lifecycle.shutdownRequested) {
        lifecycle.finish(
          lifecycle.endReason ?? (error instanceof ClosingSignal ? 'closed' : 'start_failed'),
        );
      }
      throw error instanceof ClosingSignal ? new SessionClosedError() : error;
    }
    if (!lifecycle.isClosing && this.catchUpMs > 0) {
      this.poll = this.clock.setInterval(() => this.wake(), this.catchUpMs);
    }
    this.loopPromise = this.runLoop();
  }

  /**
   * The agent state before this run: the row's, unless a holder that died
   * while starting left `loading` there; then the last other one stored.
   */
  private async stateBefore(record: ConversationRecord): Promise<AgentState | null> {
    if (record.agentState !== 'loading') return record.agentState;
    const recent = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
      reverse: true,
      limit: 50,
    });
    for (const event of recent) {
      const change = readAgentStateChange(event);
      if (change && change.agentState !== 'loading') return change.agentState;
    }
    return null;
  }

  // ---------------------------------------------------------------- the loop

  private async runLoop(): Promise<void> {
    await this.loop();
    if (!this.lifecycle.shutdownRequested)
      this.lifecycle.finish(this.lifecycle.endReason ?? 'closed');
  }

  private async loop(): Promise<void> {
    const { lifecycle, wakeSignal } = this;
    while (!lifecycle.isClosing) {
      if (this.failures > 0) await wakeSignal.backOff(this.failures);
      if (lifecycle.isClosing) break;
      wakeSignal.clear();
      this.retryWanted = false;
      try {
        await this.reader.catchUp();
        if (lifecycle.isClosing) break;
        const work = this.queue.nextWork({
          paused: this.currentState === 'paused',
          suspendedTrigger: this.turns.suspendedTrigger,
          loadingEventId: this.loadingEventId,
        });
        if (work?.kind === 'control') await this.applyControl(work.event, work.target);
        else if (work?.kind === 'message') await this.turns.run(work.event);
        else await wakeSignal.wait(lifecycle.isClosing);
        this.failures = 0;
      } catch (error) {
        if (
          lifecycle.isClosing ||
          error instanceof ClosingSignal ||
          error instanceof LeaseLostError
        )
          break;
        // A store failure: retry on the next wake-up or catch-up poll, no
        // sooner than the backoff allows; read before acting again, so that a
        // write that committed with only its answer lost is seen.
        this.error = error;
        this.failures += 1;
        this.reportError('a store write failed; retrying', error);
        this.reader.markUnread();
        this.retryWanted = true;
        await wakeSignal.wait(lifecycle.isClosing);
      }
    }
  }

  private async applyControl(event: StoredEvent, target: Control): Promise<void> {
    const cause = event.id;
    if (target === 'user_confirmed' || target === 'user_rejected') {
      // Nothing awaiting an answer: the control is spent.
      if (!(await this.turns.confirm(cause, target))) this.queue.markDone(cause);
      return;
    }
    if (target === 'stopped') {
      await this.turns.endSuspended(STOPPED_WHY);
      await this.write([agentStateChangeDraft('stopped', { cause })]);
      this.lifecycle.endWith('stopped');
      this.lifecycle.beginClosing();
    } else if (target === 'paused') {
      await this.write([agentStateChangeDraft('paused', { cause })]);
    } else {
      await this.write([
        agentStateChangeDraft(
          this.turns.suspendedTrigger !== null
            ? 'awaiting_user_confirmation'
            : 'awaiting_user_input',
          { cause },
        ),
      ]);
    }
    this.queue.markDone(cause);
  }

  // ---------------------------------------------------------------- store i/o

  /** Appends with the lease epoch, then updates what the session knows and publishes. */
  private async write(drafts: EventDraft[], final = false): Promise<StoredEvent[]> {
    if (!this.lifecycle.canWrite(final)) throw new ClosingSignal();
    let events: StoredEvent[];
    try {
      const appended = await this.store.append(this.ref.tenantId, this.ref.conversationId, drafts, {
        leaseEpoch: this.leaseEpoch,
        incarnation: this.ref.incarnation,
      });
      events = appended.map((a) => a.event).sort((a, b) => a.id - b.id);
    } catch (error) {
      if (error instanceof LeaseLostError) this.lifecycle.loseLease();
      throw error;
    }
    this.activityAt = this.clock.now();
    for (const draft of drafts) if (draft.stateDelta) this.state.apply(draft.stateDelta);
    const shared = this.record && scopedStateChangeOf(this.record, drafts);
    if (shared) this.safely(() => this.options.onScopedStateChange?.(shared));
    for (const event of events) {
      const change = readAgentStateChange(event);
      if (change) this.currentState = change.agentState;
      this.cache.put(event);
    }
    // A user event stored in between, not seen yet, leaves a gap: read it first.
    if (!this.queue.accept(events)) this.reader.markUnread();
    this.safely(() => this.broadcaster.publishEvents(this.room, events));
    return events;
  }

  /**
   * Before a step: reads the `app:` and `user:` keys again if another
   * conversation changed them. A failed read leaves the state as it was, to
   * be read at the next step; the turn goes on.
   */
  private async refreshSharedState(): Promise<void> {
    const { record } = this;
    if (!record || !this.state.isStale) return;
    try {
      await this.state.refresh(() =>
        this.store.getScopedState(record.tenantId, record.appName, record.userId),
      );
    } catch (error) {
      this.reportError('could not read the user: and app: state again', error);
    }
  }

  private async quiesce(): Promise<void> {
    await this.startPromise?.catch(() => undefined);
    await this.loopPromise;
  }

  /** Fan-out is best effort: a failing broadcaster must not break the loop. */
  private safely(publish: () => void): void {
    try {
      publish();
    } catch {
      // Clients fill gaps from the store on reconnect.
    }
  }
}

function defaultTools(): ToolRegistry {
  const registry = new ToolRegistry(30_000);
  for (const [name, tool] of Object.entries(BUILTIN_TOOLS)) registry.add(name, tool);
  return registry;
}
