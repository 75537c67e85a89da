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
 * start (`session-start`), the writes (`session-writer`), the controls
 * (`session-controls`), what it knows of its conversation
 * (`session-conversation`), the loop's waits (`wake-signal`), what is read and
 * still to handle (`user-event-queue`, `event-reader`), the turns
 * (`turn-driver`, one `active-turn` at a time, each a `turn-runner` of
 * `step-runner` steps reading `turn-history`, its tool calls run by
 * `turn-tool-calls`), titles (`conversation-title`).
 * Every part writes through one small interface, `SessionOutlet` (the
 * writer): an answer goes from the turn runner through its `ActiveTurn` to
 * the writer, and nowhere else.
 */
import type { AgentState, StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent } from './agent.js';
import { roomKey, type ConversationRef } from './conversation.js';
import { LeaseLostError } from './errors.js';
import { systemClock, type Clock } from './ports/clock.port.js';
import type { ConversationStore } from './ports/conversation-store.port.js';
import { NO_TRACING, type Tracing } from './ports/tracing.port.js';
import { EventReader } from './session/event-reader.js';
import { SessionControls } from './session/session-controls.js';
import { SessionConversation } from './session/session-conversation.js';
import { SessionLifecycle, type SessionEndReason } from './session/session-lifecycle.js';
import type { AgentSessionInit, AgentSessionOptions } from './session/session-options.js';
import { startSession } from './session/session-start.js';
import { ClosingSignal, SessionWriter } from './session/session-writer.js';
import { TurnDriver } from './session/turn-driver.js';
import { RecentEvents } from './session/turn-history.js';
import { UserEventQueue } from './session/user-event-queue.js';
import { WakeSignal } from './session/wake-signal.js';
import { outdatesScopes, type ScopedStateChange } from './state.js';
import { BUILTIN_TOOLS } from './tools/builtin-tools.js';
import { ToolRegistry } from './tools/tool-registry.js';

export { AGENT_FAILED_MESSAGE } from './session/turn-runner.js';
export { SessionClosedError } from './session/session-start.js';
export type { SessionEndReason } from './session/session-lifecycle.js';
export type {
  AgentSessionInit,
  AgentSessionOptions,
  SessionRuntime,
} from './session/session-options.js';

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
  private readonly writer: SessionWriter;
  private readonly turns: TurnDriver;
  private readonly controls: SessionControls;
  private readonly conversation: SessionConversation;

  private activityAt: number;
  private error: unknown = null;
  private retryWanted = false;
  private failures = 0;
  private startPromise: Promise<void> | null = null;
  private loopPromise: Promise<void> = Promise.resolve();
  private poll: { cancel(): void } | null = null;

  constructor(init: AgentSessionInit) {
    this.store = init.store;
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
    this.conversation = new SessionConversation(
      this.store,
      this.options.multitaskStrategy,
      this.reportError,
    );
    this.activityAt = this.clock.now();
    this.queue = new UserEventQueue(this.cache, () => {
      this.activityAt = this.clock.now();
    });
    this.lifecycle = new SessionLifecycle(() => {
      this.poll?.cancel();
      this.turns.cutForClosing('close');
      this.wakeSignal.releaseAll();
    });
    this.reader = new EventReader(
      this.store,
      this.ref,
      this.queue,
      init.options.readPageSize ?? DEFAULT_PAGE_SIZE,
      this.lifecycle,
    );
    this.closed = this.lifecycle.closed;
    const onEnd = init.options.onEnd;
    if (onEnd) void this.closed.then((reason) => onEnd(this.ref, reason));
    this.writer = new SessionWriter({
      store: this.store,
      broadcaster: init.broadcaster,
      ref: this.ref,
      leaseEpoch: this.leaseEpoch,
      options: this.options,
      room: this.room,
      lifecycle: this.lifecycle,
      conversation: this.conversation,
      cache: this.cache,
      queue: this.queue,
      reader: this.reader,
      touch: () => {
        this.activityAt = this.clock.now();
      },
    });
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
      writer: this.writer,
      conversation: this.conversation,
      lifecycle: this.lifecycle,
      wake: this.wakeSignal,
      reportError: this.reportError,
    });
    this.controls = new SessionControls(this.turns, this.queue, this.lifecycle, this.writer);
  }

  get conversationId(): string {
    return this.ref.conversationId;
  }

  get agentState(): AgentState | null {
    return this.writer.agentState;
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
    return this.conversation.state.current;
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
   * A PATCH changed the conversation's settings (`confirmation_mode`,
   * `multitask_strategy`): they are read again before the next decision that
   * uses them (a turn, a newer message, a step). Cheap; safe at any time.
   */
  settingsChanged(): void {
    this.conversation.settingsChanged();
  }

  /**
   * Another conversation stored `app:` or `user:` keys: when this one shares
   * them, they are read again before its next step. Cheap; safe at any time.
   */
  scopedStateChanged(change: ScopedStateChange): void {
    const { tenantId, userId, conversationId } = this.ref;
    const appName = this.conversation.record?.appName ?? null;
    if (outdatesScopes(change, { id: conversationId, tenantId, userId, appName }))
      this.conversation.state.markStale();
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
    this.turns.noteClosing('stop');
    lifecycle.beginClosing();
    if (notice) this.writer.publishStatus(notice);
    await this.quiesce();
    if (
      lifecycle.isWritable &&
      this.conversation.loadingEventId >= 0 &&
      this.writer.agentState !== 'stopped'
    ) {
      try {
        await this.controls.storeStopped(reason === undefined ? {} : { reason }, true);
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
    await startSession({
      store: this.store,
      ref: this.ref,
      lifecycle: this.lifecycle,
      queue: this.queue,
      reader: this.reader,
      outlet: this.writer,
      conversation: this.conversation,
    });
    if (!this.lifecycle.isClosing && this.catchUpMs > 0) {
      this.poll = this.clock.setInterval(() => this.wake(), this.catchUpMs);
    }
    this.loopPromise = this.runLoop();
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
          paused: this.writer.agentState === 'paused',
          suspendedTrigger: this.turns.suspendedTrigger,
          loadingEventId: this.conversation.loadingEventId,
        });
        if (work?.kind === 'control') await this.controls.apply(work.event, work.target);
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

  private async quiesce(): Promise<void> {
    await this.startPromise?.catch(() => undefined);
    await this.loopPromise;
  }
}

function defaultTools(): ToolRegistry {
  const registry = new ToolRegistry(30_000);
  for (const [name, tool] of Object.entries(BUILTIN_TOOLS)) registry.add(name, tool);
  return registry;
}
