/**
 * AgentSession: the agent loop of one running conversation, on exactly one
 * process (the holder of the conversation's lease).
 *
 * It reads user events from the store after the ones it has handled, runs the
 * conversation's agent once per user message, appends what the agent yields
 * and moves the agent state through `loading → awaiting_user_input ⇄ running →
 * stopped / error`, each change a stored `agent_state_changed` observation
 * (see `session/agent-state-change.ts`). Every append carries the session's
 * lease epoch: a session that lost its lease stops at once and writes nothing
 * more.
 *
 * Exactly-once answers: a user event is handled iff a settled state change
 * (not `running` / `loading`) with the event's id as `cause` is stored. The
 * agent's last event of a turn is held back and appended in one batch with the
 * settling `awaiting_user_input`, so a crash anywhere in a turn either leaves
 * the message unhandled (the next holder runs the turn again) or leaves both
 * the answer and the settled state stored (never answered twice).
 *
 * The set of handled events (rather than a single cursor) is what is restored:
 * control actions (`change_agent_state`) are applied as soon as they arrive,
 * ahead of messages queued behind a pause, so handling is not strictly in id
 * order. When handling is in id order the two coincide.
 */
import { StatusId, isAction } from '@cs/protocol';
import type { AgentState, StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent, AgentOutput } from './agent.js';
import { roomKey, type ConversationRef, type EventDraft } from './conversation.js';
import { DomainError, LeaseLostError, NotFoundError } from './errors.js';
import type { ConversationBroadcaster } from './ports/broadcaster.port.js';
import { systemClock, type Clock } from './ports/clock.port.js';
import type { ConversationStore } from './ports/conversation-store.port.js';
import {
  AGENT_ERROR_REASON,
  MAX_ITERATIONS_REASON,
  agentStateChangeDraft,
  isSettledState,
  readAgentStateChange,
} from './session/agent-state-change.js';
import { applyDelta } from './state.js';

export interface AgentSessionOptions {
  /** Events one turn may yield; the next one ends the turn in `error` (`max_iterations`). */
  maxIterations: number;
  /**
   * How often the session looks for new user events without a wake-up
   * (default 1000 ms); 0: never, its holder looks for them (see `lastEventId`).
   */
  catchUpIntervalMs?: number;
  clock?: Clock;
  /** Events read per page when restoring and catching up (default 500). */
  readPageSize?: number;
  /**
   * Where what went wrong is told in full (logs): clients see only a safe
   * message (an agent's exception text may hold a backend's host names).
   */
  reportError?: (message: string, error: unknown) => void;
}

export interface AgentSessionInit {
  store: ConversationStore;
  broadcaster: ConversationBroadcaster;
  ref: ConversationRef;
  /** The epoch from `store.acquireLease`, acquired by the caller before `start()`. */
  leaseEpoch: number;
  agent: Agent;
  options: AgentSessionOptions;
}

/**
 * Why a session ended: `stopped` (a user's stop or `stop()`), `closed`
 * (`close()`, nothing written), `lease_lost` (a newer holder exists),
 * `start_failed` (the start threw).
 */
export type SessionEndReason = 'stopped' | 'closed' | 'lease_lost' | 'start_failed';

/** `start()` rejects with this when the session was stopped or closed before it was ready. */
export class SessionClosedError extends Error {
  constructor(message = 'the session was closed before it was ready') {
    super(message);
    this.name = 'SessionClosedError';
  }
}

/** Internal: a write attempted after closing began. Never escapes the session. */
class ClosingSignal extends Error {}

const ABORTED: unique symbol = Symbol('aborted');
/** The abort reason an agent's signal carries once its turn is over. */
const TURN_OVER = Object.freeze(new Error('the turn is over'));

interface Turn {
  trigger: StoredEvent;
  controller: AbortController;
  /** `running` is stored with the turn's first write, or alone once the turn lasts. */
  runningStored: boolean;
  /** The turn's writes, in order (the deferred `running` may be one of them). */
  writes: Promise<unknown>;
  runningTimer: ReturnType<typeof setTimeout> | undefined;
}

/**
 * A turn that answers within this time stores `running` in the same
 * transaction as its answer: one durable write fewer per turn. A longer turn
 * shows `running` after this delay.
 */
const RUNNING_DEFER_MS = 20;

type TurnOutcome =
  | { kind: 'completed'; held: EventDraft | null }
  | { kind: 'max_iterations'; held: EventDraft | null }
  | { kind: 'failed'; held: EventDraft | null; error: unknown }
  | { kind: 'interrupted' };

type RequestedState = 'stopped' | 'paused' | 'running';

type Work =
  | { kind: 'control'; event: StoredEvent; target: RequestedState }
  | { kind: 'message'; event: StoredEvent };

const DEFAULT_CATCH_UP_MS = 1000;
const DEFAULT_PAGE_SIZE = 500;
/** After a failed store write the loop waits this long, doubled each time, before trying again. */
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 5_000;
/** Times the agent runs for one message whose turn could not be stored; then it ends in error. */
const MAX_TURN_ATTEMPTS = 3;

/** What clients see of a turn that failed; the detail goes to `reportError`. */
export const AGENT_FAILED_MESSAGE = 'The agent failed to answer.';
export const OUTPUT_REFUSED_MESSAGE = 'The agent produced an answer that could not be stored.';
export const STORE_FAILED_MESSAGE = 'The answer could not be stored; send the message again.';

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
  private readonly clock: Clock;
  private readonly maxIterations: number;
  private readonly catchUpMs: number;
  private readonly pageSize: number;

  /**
   * Every stored event read so far, as JSON (ids are gap-free, so entry `id`
   * is event `id`). One string per event rather than a tree of objects: a
   * worker holds the histories of thousands of conversations, and the garbage
   * collector marks a string at once where it would trace every object of an
   * event (long histories made for pauses of hundreds of milliseconds).
   */
  private readonly history: string[] = [];
  /** User events settled by a stored state change (their ids). */
  private readonly handled = new Set<number>();
  /** User events this session deliberately skips (stale stops, unknown actions). */
  private readonly ignored = new Set<number>();
  /** User events read and not yet handled, in id order. */
  private pending: StoredEvent[] = [];
  private state: Record<string, unknown> = {};
  private instructions: string | null = null;
  private currentState: AgentState | null = null;
  private activityAt: number;
  /** Id of this session's `loading` event: stops stored before it are stale. */
  private loadingEventId = -1;
  private turn: Turn | null = null;
  private error: unknown = null;

  private startPromise: Promise<void> | null = null;
  private loopPromise: Promise<void> = Promise.resolve();
  private poll: { cancel(): void } | null = null;
  /** The store may hold events this session has not seen: the loop reads before it acts. */
  private unread = true;
  /** The loop recovered from a store failure and waits for a wake-up to try again. */
  private retryWanted = false;
  private wakePending = false;
  private wakeWaiter: (() => void) | null = null;
  private backoffWaiter: (() => void) | null = null;
  /** Store failures in a row (the backoff doubles with each). */
  private failures = 0;
  /** Times the agent ran for a message whose turn did not settle yet, by message id. */
  private readonly attempts = new Map<number, number>();
  private readonly reportError: (message: string, error: unknown) => void;
  private syncRun: Promise<void> | null = null;
  private syncAgain = false;

  /** No new work is taken; writes other than `stop()`'s final one are refused. */
  private closing = false;
  /** False once the lease is lost or the session finished. */
  private writable = true;
  private shutdownRequested = false;
  private finished = false;
  private endReason: SessionEndReason | null = null;
  private resolveClosed: (reason: SessionEndReason) => void = () => undefined;

  constructor(init: AgentSessionInit) {
    this.store = init.store;
    this.broadcaster = init.broadcaster;
    this.ref = { ...init.ref };
    this.room = roomKey(init.ref);
    this.leaseEpoch = init.leaseEpoch;
    this.agent = init.agent;
    this.clock = init.options.clock ?? systemClock;
    this.maxIterations = init.options.maxIterations;
    this.catchUpMs = init.options.catchUpIntervalMs ?? DEFAULT_CATCH_UP_MS;
    this.pageSize = init.options.readPageSize ?? DEFAULT_PAGE_SIZE;
    this.reportError = init.options.reportError ?? (() => undefined);
    this.activityAt = this.clock.now();
    this.closed = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
  }

  get conversationId(): string {
    return this.ref.conversationId;
  }

  /** The agent state this session last stored (or restored). */
  get agentState(): AgentState | null {
    return this.currentState;
  }

  /** Clock time of the last stored event this session wrote or saw. */
  get lastActivity(): number {
    return this.activityAt;
  }

  /** Id of the newest event this session has (read or written); -1 before any. */
  get lastEventId(): number {
    return this.history.length - 1;
  }

  /** True while the agent is running a turn. */
  get isMidTurn(): boolean {
    return this.turn !== null;
  }

  get isClosed(): boolean {
    return this.finished;
  }

  /** The session state the agent sees, `temp:` keys included. */
  get sessionState(): Readonly<Record<string, unknown>> {
    return { ...this.state };
  }

  /**
   * True while the loop waits to try again after a store failure: a holder
   * that does the catch-up itself (`catchUpIntervalMs` 0) wakes it.
   */
  get wantsRetry(): boolean {
    return this.retryWanted;
  }

  /** The last store error the loop recovered from (it retries on the next wake-up or poll). */
  get lastError(): unknown {
    return this.error;
  }

  /**
   * Stores `loading`, restores history and state, stores `awaiting_user_input`
   * (or `paused` when the conversation was paused) and resolves: the session is
   * ready. Pending user events are then processed in the background.
   */
  start(): Promise<void> {
    this.startPromise ??= this.boot();
    return this.startPromise;
  }

  /**
   * A hint that new user events were stored. Cheap; safe to call at any time.
   * With the stored events themselves (as the writer got them back), the
   * session reads nothing when they follow on from what it has; otherwise it
   * reads after the last event it has.
   */
  wake(events?: readonly StoredEvent[]): void {
    if (this.closing) return;
    if (!events || !this.accept(events)) this.unread = true;
    this.wakePending = true;
    this.releaseWaiter();
    if (this.turn) void this.checkForInterruption();
  }

  /**
   * Stops the agent: aborts the current turn, publishes `notice` to the room
   * (if given), stores `stopped` (with `extras.reason` if given) and closes.
   */
  async stop(reason?: string, notice?: StatusUpdate): Promise<void> {
    if (this.shutdownRequested || this.finished) {
      await this.closed;
      return;
    }
    this.shutdownRequested = true;
    this.beginClosing();
    if (notice) this.safely(() => this.broadcaster.publishStatus(this.room, notice));
    await this.quiesce();
    if (this.writable && this.loadingEventId >= 0 && this.currentState !== 'stopped') {
      try {
        await this.write(
          [agentStateChangeDraft('stopped', reason === undefined ? {} : { reason })],
          true,
        );
      } catch (error) {
        if (!(error instanceof LeaseLostError)) this.error = error;
      }
    }
    this.finish(this.endReason ?? 'stopped');
  }

  /**
   * Closes without writing (shutdown, idle close, lease hand-off): the current
   * turn is aborted and left unhandled, so the next holder runs it again.
   * Resolves when no more writes can happen.
   */
  async close(): Promise<void> {
    if (!this.shutdownRequested && !this.finished) {
      this.shutdownRequested = true;
      this.endReason ??= 'closed';
      this.beginClosing();
      await this.quiesce();
      this.finish(this.endReason);
    }
    await this.closed;
  }

  // ---------------------------------------------------------------- start

  private async boot(): Promise<void> {
    try {
      if (this.closing) throw new ClosingSignal();
      const [loading] = await this.write([agentStateChangeDraft('loading')]);
      this.loadingEventId = loading?.id ?? -1;
      const previous = await this.restore();
      const ready = previous === 'paused' ? 'paused' : 'awaiting_user_input';
      await this.write([agentStateChangeDraft(ready)]);
    } catch (error) {
      if (error instanceof LeaseLostError) this.loseLease();
      if (!this.shutdownRequested) {
        this.finish(this.endReason ?? (error instanceof ClosingSignal ? 'closed' : 'start_failed'));
      }
      throw error instanceof ClosingSignal ? new SessionClosedError() : error;
    }
    if (!this.closing && this.catchUpMs > 0) {
      this.poll = this.clock.setInterval(() => this.wake(), this.catchUpMs);
    }
    this.loopPromise = this.runLoop();
  }

  /** Loads state and history; returns the agent state stored before this session began. */
  private async restore(): Promise<AgentState | null> {
    const [snapshot] = await Promise.all([
      this.store.getSnapshot(this.ref.tenantId, this.ref.conversationId),
      this.sync(),
    ]);
    if (!snapshot) throw new NotFoundError();
    this.state = { ...snapshot.state };
    this.instructions = snapshot.conversation.instructions;
    // `loading` says nothing: a holder that died while starting leaves one behind.
    for (let id = this.loadingEventId - 1; id >= 0; id -= 1) {
      const event = this.eventAt(id);
      const change = event ? readAgentStateChange(event) : null;
      if (change && change.agentState !== 'loading') return change.agentState;
    }
    return null;
  }

  // ---------------------------------------------------------------- the loop

  private async runLoop(): Promise<void> {
    await this.loop();
    if (!this.shutdownRequested) this.finish(this.endReason ?? 'closed');
  }

  private async loop(): Promise<void> {
    while (!this.closing) {
      if (this.failures > 0) await this.backOff();
      if (this.closing) break;
      this.wakePending = false;
      this.retryWanted = false;
      try {
        if (this.unread) await this.sync();
        if (this.closing) break;
        const work = this.nextWork();
        if (work?.kind === 'control') await this.applyControl(work.event, work.target);
        else if (work?.kind === 'message') await this.runTurn(work.event);
        else await this.waitForWake();
        this.failures = 0;
      } catch (error) {
        if (this.closing || error instanceof ClosingSignal || error instanceof LeaseLostError) {
          break;
        }
        // A store failure: retry on the next wake-up or catch-up poll, no
        // sooner than the backoff allows. An unsettled turn is simply run
        // again (at most MAX_TURN_ATTEMPTS times); its final batch is atomic.
        // The write may have committed with only its answer lost: read before
        // acting again, so that a stored answer is seen and not given twice.
        this.error = error;
        this.failures += 1;
        this.reportError('a store write failed; retrying', error);
        this.unread = true;
        this.retryWanted = true;
        await this.waitForWake();
      }
    }
  }

  /** Waits out the backoff of the failures so far (cut short by closing). */
  private backOff(): Promise<void> {
    const delay = Math.min(RETRY_BASE_MS * 2 ** (this.failures - 1), RETRY_MAX_MS);
    return new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, delay);
      timer.unref();
      this.backoffWaiter = () => {
        clearTimeout(timer);
        resolve();
      };
    }).finally(() => {
      this.backoffWaiter = null;
    });
  }

  /** What to do next: control actions first (in id order), then the oldest message unless paused. */
  private nextWork(): Work | null {
    this.pending = this.pending.filter((e) => !this.handled.has(e.id) && !this.ignored.has(e.id));
    for (const event of this.pending) {
      const target = requestedState(event);
      if (target === undefined) continue;
      // A stop stored before this session began was meant for a run that is
      // over (or never happened): starting again supersedes it.
      if (target === null || (target === 'stopped' && event.id < this.loadingEventId)) {
        this.ignored.add(event.id);
        continue;
      }
      return { kind: 'control', event, target };
    }
    if (this.currentState === 'paused') return null;
    const message = this.pending.find((e) => isUserMessage(e));
    if (message) return { kind: 'message', event: message };
    for (const event of this.pending) if (!isUserMessage(event)) this.ignored.add(event.id);
    return null;
  }

  private async applyControl(event: StoredEvent, target: RequestedState): Promise<void> {
    const cause = event.id;
    if (target === 'stopped') {
      await this.write([agentStateChangeDraft('stopped', { cause })]);
      this.endReason ??= 'stopped';
      this.beginClosing();
    } else if (target === 'paused') {
      await this.write([agentStateChangeDraft('paused', { cause })]);
    } else {
      // Resume (or a no-op request to run): ready again; queued messages follow.
      await this.write([agentStateChangeDraft('awaiting_user_input', { cause })]);
    }
  }

  // ---------------------------------------------------------------- one turn

  private async runTurn(trigger: StoredEvent): Promise<void> {
    const attempts = (this.attempts.get(trigger.id) ?? 0) + 1;
    if (attempts > MAX_TURN_ATTEMPTS) {
      // The agent answered before and its answer could never be stored: not again.
      await this.endTurnInError(trigger.id, STORE_FAILED_MESSAGE);
      this.attempts.delete(trigger.id);
      return;
    }
    this.attempts.set(trigger.id, attempts);
    const turn: Turn = {
      trigger,
      controller: new AbortController(),
      runningStored: false,
      writes: Promise.resolve(),
      runningTimer: undefined,
    };
    this.turn = turn;
    // A wake-up that came while the loop was reading may carry a pause or stop.
    if (this.wakePending) void this.checkForInterruption();
    turn.runningTimer = setTimeout(() => {
      // Failures surface on the turn's next write (the chain keeps the rejection).
      this.writeInTurn(turn, []).catch(() => undefined);
    }, RUNNING_DEFER_MS);
    try {
      const outcome = await this.driveAgent(turn);
      const cause = trigger.id;
      const held = outcome.kind === 'interrupted' ? [] : outcome.held ? [outcome.held] : [];
      switch (outcome.kind) {
        case 'completed':
          await this.writeInTurn(turn, [
            ...held,
            agentStateChangeDraft('awaiting_user_input', { cause }),
          ]);
          break;
        case 'max_iterations':
          await this.writeInTurn(turn, [
            ...held,
            agentStateChangeDraft('error', { cause, reason: MAX_ITERATIONS_REASON }),
          ]);
          break;
        case 'failed': {
          this.reportError(`the agent of ${this.ref.conversationId} failed`, outcome.error);
          await this.writeInTurn(turn, [
            ...held,
            agentStateChangeDraft('error', {
              cause,
              reason: AGENT_ERROR_REASON,
              message: AGENT_FAILED_MESSAGE,
            }),
          ]);
          this.announceError(AGENT_FAILED_MESSAGE);
          break;
        }
        case 'interrupted':
          // Paused, stopped, closed or lease lost: the turn stays unhandled.
          break;
      }
      if (outcome.kind !== 'interrupted') this.attempts.delete(trigger.id);
    } catch (error) {
      if (!isRefusedWrite(error)) throw error;
      // The store refuses what the agent produced (a NUL, a lone surrogate,
      // too large): trying again would produce it again. The turn ends here.
      this.reportError(`the store refused an output of ${this.ref.conversationId}`, error);
      await this.endTurnInError(trigger.id, OUTPUT_REFUSED_MESSAGE);
      this.attempts.delete(trigger.id);
    } finally {
      clearTimeout(turn.runningTimer);
      // A shared reason: a default one is a new DOMException, stack and all, every turn.
      turn.controller.abort(TURN_OVER);
      // Nothing of this turn may land after the next one's writes.
      await turn.writes.catch(() => undefined);
      if (this.turn === turn) this.turn = null;
    }
  }

  /** Settles a turn in `error` (`agent_error`) with a message safe to show, and says so. */
  private async endTurnInError(cause: number, message: string): Promise<void> {
    await this.write([
      agentStateChangeDraft('error', { cause, reason: AGENT_ERROR_REASON, message }),
    ]);
    this.announceError(message);
  }

  private announceError(message: string): void {
    this.safely(() =>
      this.broadcaster.publishStatus(this.room, {
        status_update: true,
        type: 'error',
        id: StatusId.AgentError,
        message,
      }),
    );
  }

  /**
   * Appends a turn's events after its earlier writes, with `running` first if
   * it was not stored yet.
   */
  private writeInTurn(turn: Turn, drafts: EventDraft[]): Promise<StoredEvent[]> {
    const write = turn.writes.then(() => {
      const batch = turn.runningStored
        ? drafts
        : [agentStateChangeDraft('running', { cause: turn.trigger.id }), ...drafts];
      turn.runningStored = true;
      return batch.length > 0 ? this.write(batch) : [];
    });
    turn.writes = write;
    return write;
  }

  /** Runs the agent, appending all but its last event; returns how the turn ended. */
  private async driveAgent(turn: Turn): Promise<TurnOutcome> {
    const { trigger, controller } = turn;
    const signal = controller.signal;
    // The history is copied only if the agent reads it: a turn must not cost
    // a copy of a long history when its agent does not look.
    const end = this.history.length;
    const copyHistory = () => this.historyFor(trigger, end);
    let history: StoredEvent[] | undefined;
    const outputs = this.agent.run({
      conversationId: this.ref.conversationId,
      get history() {
        return (history ??= copyHistory());
      },
      state: { ...this.state },
      instructions: this.instructions,
      trigger,
      signal,
    });
    const iterator = outputs[Symbol.asyncIterator]();
    let held: EventDraft | null = null;
    let yielded = 0;
    let done = false;
    try {
      for (;;) {
        let step: IteratorResult<AgentOutput> | typeof ABORTED;
        try {
          step = await untilAborted(iterator.next(), signal);
        } catch (error) {
          if (signal.aborted) return { kind: 'interrupted' };
          done = true; // a generator that threw is finished
          return { kind: 'failed', held, error };
        }
        if (step === ABORTED) return { kind: 'interrupted' };
        if (step.done) {
          done = true;
          return { kind: 'completed', held };
        }
        const output = step.value;
        if (output.type === 'delta') {
          this.safely(() =>
            this.broadcaster.publishStream(this.room, {
              stream: true,
              cause: trigger.id,
              delta: output.delta,
            }),
          );
          continue;
        }
        yielded += 1;
        if (yielded > this.maxIterations) return { kind: 'max_iterations', held };
        if (held) await this.writeInTurn(turn, [held]);
        if (signal.aborted) return { kind: 'interrupted' };
        held = {
          source: 'agent',
          body: output.body,
          cause: trigger.id,
          metricsDelta: { ...output.metricsDelta, iterations: 1 },
          ...(output.stateDelta ? { stateDelta: output.stateDelta } : {}),
        };
      }
    } finally {
      if (!done) {
        controller.abort();
        // Do not wait: an agent that ignores its signal must not hold the session.
        iterator.return?.().then(undefined, () => undefined);
      }
    }
  }

  /**
   * The history a turn sees, in id order: everything up to and including the
   * trigger, plus what earlier turns stored after it (when messages queue, the
   * answer to the previous one comes after the trigger's id), but no later user
   * event nor anything caused by one; of the first `end` events, those stored
   * when the turn began.
   */
  private historyFor(trigger: StoredEvent, end: number): StoredEvent[] {
    const seen: StoredEvent[] = [];
    for (let id = 0; id < end; id += 1) {
      const event = this.eventAt(id)!;
      if (id <= trigger.id || (event.source !== 'user' && (event.cause ?? -1) < trigger.id))
        seen.push(event);
    }
    return seen;
  }

  /** The stored event `id` of the history (a copy), if read. */
  private eventAt(id: number): StoredEvent | undefined {
    const json = this.history[id];
    return json === undefined ? undefined : (JSON.parse(json) as StoredEvent);
  }

  /** Mid-turn: a pause or stop that arrived ends the turn at once. */
  private async checkForInterruption(): Promise<void> {
    try {
      if (this.unread) await this.sync();
    } catch {
      return; // the loop's next read retries
    }
    const turn = this.turn;
    if (!turn) return;
    const interrupting = this.pending.some((event) => {
      if (this.handled.has(event.id) || this.ignored.has(event.id)) return false;
      const target = requestedState(event);
      if (target === 'paused') return true;
      return target === 'stopped' && event.id > this.loadingEventId;
    });
    if (interrupting) turn.controller.abort();
  }

  // ---------------------------------------------------------------- store i/o

  /** Appends with the lease epoch, then updates memory and publishes. */
  private async write(drafts: EventDraft[], final = false): Promise<StoredEvent[]> {
    if (!this.writable || (this.closing && !final)) throw new ClosingSignal();
    let events: StoredEvent[];
    try {
      const appended = await this.store.append(this.ref.tenantId, this.ref.conversationId, drafts, {
        leaseEpoch: this.leaseEpoch,
        incarnation: this.ref.incarnation,
      });
      events = appended.map((a) => a.event).sort((a, b) => a.id - b.id);
    } catch (error) {
      if (error instanceof LeaseLostError) this.loseLease();
      throw error;
    }
    this.activityAt = this.clock.now();
    for (const draft of drafts) {
      if (draft.stateDelta) this.state = applyDelta(this.state, draft.stateDelta);
    }
    for (const event of events) {
      const change = readAgentStateChange(event);
      if (change) this.currentState = change.agentState;
      this.noteSettled(event);
    }
    // A user event stored in between, not seen yet, leaves a gap: read it first.
    if (!this.accept(events)) this.unread = true;
    this.safely(() => this.broadcaster.publishEvents(this.room, events));
    return events;
  }

  /** Reads every event after the last one read (single flight; re-runs if asked meanwhile). */
  private sync(): Promise<void> {
    if (this.syncRun) {
      this.syncAgain = true;
      return this.syncRun;
    }
    this.syncRun = (async () => {
      try {
        do {
          this.syncAgain = false;
          this.unread = false;
          await this.readNewEvents();
        } while (this.syncAgain && !this.finished);
      } finally {
        this.syncRun = null;
      }
    })();
    return this.syncRun;
  }

  private async readNewEvents(): Promise<void> {
    for (;;) {
      const page = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
        fromId: this.history.length,
        limit: this.pageSize,
      });
      if (!this.accept(page) || page.length < this.pageSize) return;
    }
  }

  /**
   * Adds stored events to the history in id order: ones already there are
   * skipped, and a gap stops it (false), since ids are gap-free and none may
   * be skipped.
   */
  private accept(events: readonly StoredEvent[]): boolean {
    for (const event of events) {
      if (event.id < this.history.length) continue;
      if (event.id > this.history.length) return false;
      this.history.push(JSON.stringify(event));
      this.noteSettled(event);
      if (event.source === 'user') {
        this.pending.push(event);
        this.activityAt = this.clock.now();
      }
    }
    return true;
  }

  private noteSettled(event: StoredEvent): void {
    const change = readAgentStateChange(event);
    if (change && event.cause !== undefined && isSettledState(change.agentState)) {
      this.handled.add(event.cause);
    }
  }

  // ---------------------------------------------------------------- lifecycle

  private waitForWake(): Promise<void> {
    if (this.wakePending || this.closing) return Promise.resolve();
    return new Promise((resolve) => {
      this.wakeWaiter = resolve;
    });
  }

  private releaseWaiter(): void {
    const waiter = this.wakeWaiter;
    this.wakeWaiter = null;
    waiter?.();
  }

  private releaseBackoff(): void {
    this.backoffWaiter?.();
  }

  private beginClosing(): void {
    this.closing = true;
    this.poll?.cancel();
    this.turn?.controller.abort();
    this.releaseWaiter();
    this.releaseBackoff();
  }

  private loseLease(): void {
    this.writable = false;
    this.endReason = 'lease_lost';
    this.beginClosing();
  }

  /** Waits until the start and the loop have returned: no write is in flight after this. */
  private async quiesce(): Promise<void> {
    await this.startPromise?.catch(() => undefined);
    await this.loopPromise;
  }

  private finish(reason: SessionEndReason): void {
    if (this.finished) return;
    this.finished = true;
    this.writable = false;
    this.beginClosing();
    this.resolveClosed(reason);
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

/** The state a `change_agent_state` user event asks for; null if malformed, undefined if not one. */
function requestedState(event: StoredEvent): RequestedState | null | undefined {
  if (!isAction(event) || event.action !== 'change_agent_state') return undefined;
  const target = event.args['agent_state'];
  return target === 'stopped' || target === 'paused' || target === 'running' ? target : null;
}

function isUserMessage(event: StoredEvent): boolean {
  return isAction(event) && event.action === 'message';
}

/** A write the store refused for what it holds: the same write would be refused again. */
function isRefusedWrite(error: unknown): boolean {
  return error instanceof DomainError && error.code === 'BAD_REQUEST';
}

/** Resolves with the promise's value, or `ABORTED` as soon as the signal aborts. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T | typeof ABORTED> {
  if (signal.aborted) {
    promise.then(undefined, () => undefined);
    return Promise.resolve(ABORTED);
  }
  return new Promise<T | typeof ABORTED>((resolve, reject) => {
    const onAbort = (): void => resolve(ABORTED);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}
