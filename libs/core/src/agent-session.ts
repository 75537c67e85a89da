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
 */
import { StatusId, isAction } from '@cs/protocol';
import type { AgentState, MultitaskStrategy, StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent } from './agent.js';
import {
  roomKey,
  type ConversationRecord,
  type ConversationRef,
  type EventDraft,
} from './conversation.js';
import { DomainError, LeaseLostError, NotFoundError } from './errors.js';
import type { ConversationBroadcaster } from './ports/broadcaster.port.js';
import { systemClock, type Clock } from './ports/clock.port.js';
import type { ConversationStore } from './ports/conversation-store.port.js';
import { NO_RUNTIME_METRICS, type RuntimeMetrics } from './ports/runtime-metrics.port.js';
import { NO_TRACING, type Tracing } from './ports/tracing.port.js';
import {
  AGENT_ERROR_REASON,
  agentStateChangeDraft,
  isSettledState,
  readAgentStateChange,
} from './session/agent-state-change.js';
import type { StepUsage } from './session/step-runner.js';
import { fallbackTitle } from './session/title.js';
import { RecentEvents } from './session/turn-history.js';
import { TurnRunner, emptyProgress, readTurnProgress } from './session/turn-runner.js';
import { applyDelta } from './state.js';
import { BUILTIN_TOOLS } from './tools/builtin-tools.js';
import { ToolRegistry } from './tools/tool-registry.js';

export { AGENT_FAILED_MESSAGE } from './session/turn-runner.js';

export interface AgentSessionOptions {
  /** Steps one turn may take (`MAX_ITERATIONS`); a conversation's own limit may only lower it. */
  maxIterations: number;
  /** The most one turn may cost (`MAX_BUDGET_PER_TASK_USD`; 0: none). */
  maxBudgetUsd?: number;
  /** The deployment's `MULTITASK_STRATEGY` (a conversation's own wins). */
  multitaskStrategy?: MultitaskStrategy;
  /** The tools agents may call (default: the built-ins). */
  tools?: ToolRegistry;
  metrics?: RuntimeMetrics;
  /** Turns, steps and tool calls as spans of their message's trace. */
  tracing?: Tracing;
  /** Prices a usage by `LLM_PRICES` (the conversation's model, if it names one). */
  price?: (model: string | undefined, usage: StepUsage) => number;
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

/** What every session of a process shares: tools, metrics, the deployment's limits and prices. */
export type SessionRuntime = Pick<
  AgentSessionOptions,
  'tools' | 'metrics' | 'tracing' | 'maxBudgetUsd' | 'multitaskStrategy' | 'price'
>;

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

const DEFAULT_CATCH_UP_MS = 1000;
const DEFAULT_PAGE_SIZE = 500;
/** After a failed store write the loop waits this long, doubled each time, before trying again. */
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 5_000;
/** Times the agent runs for one message whose turn could not be stored; then it ends in error. */
const MAX_TURN_ATTEMPTS = 3;
/**
 * A turn that answers within this time stores `running` in the same
 * transaction as its answer: one durable write fewer per turn.
 */
const RUNNING_DEFER_MS = 20;

export const OUTPUT_REFUSED_MESSAGE = 'The agent produced an answer that could not be stored.';
export const STORE_FAILED_MESSAGE = 'The answer could not be stored; send the message again.';

/** Why a running turn was cut: a user's control, a newer message, or the session closing. */
type Cut = 'control' | 'interrupt' | 'stop' | 'close';

interface ActiveTurn {
  runner: TurnRunner;
  controller: AbortController;
  cut: Cut | null;
  runningStored: boolean;
  writes: Promise<unknown>;
  runningTimer: ReturnType<typeof setTimeout> | undefined;
}

type Control = 'stopped' | 'paused' | 'running' | 'user_confirmed' | 'user_rejected';
type Work =
  | { kind: 'control'; event: StoredEvent; target: Control }
  | { kind: 'message'; event: StoredEvent };

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
  private readonly pageSize: number;
  private readonly reportError: (message: string, error: unknown) => void;
  private readonly cache = new RecentEvents();
  private readonly tracing: Tracing;
  /** The trace each pending user message arrived in (by event id), until its turn runs. */
  private readonly traces = new Map<number, string>();

  /** The id the next stored event will have: everything before it was read. */
  private nextId = 0;
  /** User events read and not yet handled, in id order. */
  private pending: StoredEvent[] = [];
  /** Pending user events settled (controls applied, messages answered) or skipped. */
  private readonly done = new Set<number>();
  private record: ConversationRecord | null = null;
  private state: Record<string, unknown> = {};
  private currentState: AgentState | null = null;
  private activityAt: number;
  /** Id of this session's `loading` event: what was stored before it, a new holder resumes. */
  private loadingEventId = -1;
  private turn: ActiveTurn | null = null;
  /** A turn whose tool calls await the user's confirmation. */
  private suspended: TurnRunner | null = null;
  private titled = false;
  private error: unknown = null;

  private startPromise: Promise<void> | null = null;
  private loopPromise: Promise<void> = Promise.resolve();
  private poll: { cancel(): void } | null = null;
  private unread = true;
  private retryWanted = false;
  private wakePending = false;
  private wakeWaiter: (() => void) | null = null;
  private backoffWaiter: (() => void) | null = null;
  private failures = 0;
  private readonly attempts = new Map<number, number>();
  private syncRun: Promise<void> | null = null;
  private syncAgain = false;

  private closing = false;
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
    this.options = init.options;
    this.clock = init.options.clock ?? systemClock;
    this.tools = init.options.tools ?? defaultTools();
    this.tracing = init.options.tracing ?? NO_TRACING;
    this.catchUpMs = init.options.catchUpIntervalMs ?? DEFAULT_CATCH_UP_MS;
    this.pageSize = init.options.readPageSize ?? DEFAULT_PAGE_SIZE;
    this.reportError = init.options.reportError ?? (() => undefined);
    this.activityAt = this.clock.now();
    this.closed = new Promise((resolve) => {
      this.resolveClosed = resolve;
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
    return this.nextId - 1;
  }

  get isMidTurn(): boolean {
    return this.turn !== null;
  }

  get isClosed(): boolean {
    return this.finished;
  }

  get sessionState(): Readonly<Record<string, unknown>> {
    return { ...this.state };
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
    if (this.closing) return;
    // The wake-up arrives in its message's trace: the turn continues it.
    const trace = events ? this.tracing.currentTraceparent() : undefined;
    if (trace) {
      for (const event of events ?? [])
        if (event.source === 'user') this.traces.set(event.id, trace);
      while (this.traces.size > 1_000)
        this.traces.delete(this.traces.keys().next().value as number);
    }
    if (!events || !this.accept(events)) this.unread = true;
    this.wakePending = true;
    this.releaseWaiter();
    if (this.turn) void this.checkForInterruption();
  }

  /**
   * Stops the agent: a running step is cut (its partial text stored as
   * interrupted), `notice` goes to the room, `stopped` is stored (with
   * `extras.reason` if given) and the session closes.
   */
  async stop(reason?: string, notice?: StatusUpdate): Promise<void> {
    if (this.shutdownRequested || this.finished) {
      await this.closed;
      return;
    }
    this.shutdownRequested = true;
    if (this.turn) this.turn.cut ??= 'stop';
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
   * Closes without writing (shutdown, idle close, lease hand-off): a running
   * turn is cut and left as stored, so the next holder goes on with it.
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
      // Read before `loading` is stored: the state before this run (paused?).
      const snapshot = await this.store.getSnapshot(this.ref.tenantId, this.ref.conversationId);
      if (!snapshot || snapshot.conversation.incarnation !== this.ref.incarnation)
        throw new NotFoundError();
      this.record = snapshot.conversation;
      this.state = { ...snapshot.state };
      this.titled = snapshot.conversation.title !== '';
      const previous = await this.stateBefore(snapshot.conversation);
      // Everything up to `answered_through` is settled: only what follows is read.
      this.nextId = snapshot.conversation.answeredThrough + 1;
      const [loading] = await this.write([agentStateChangeDraft('loading')]);
      this.loadingEventId = loading?.id ?? -1;
      await this.sync();
      await this.write([
        agentStateChangeDraft(previous === 'paused' ? 'paused' : 'awaiting_user_input'),
      ]);
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
        if (this.closing || error instanceof ClosingSignal || error instanceof LeaseLostError)
          break;
        // A store failure: retry on the next wake-up or catch-up poll, no
        // sooner than the backoff allows; read before acting again, so that a
        // write that committed with only its answer lost is seen.
        this.error = error;
        this.failures += 1;
        this.reportError('a store write failed; retrying', error);
        this.unread = true;
        this.retryWanted = true;
        await this.waitForWake();
      }
    }
  }

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

  /** Controls first (in id order), then the oldest message unless paused or awaiting a confirmation. */
  private nextWork(): Work | null {
    this.pending = this.pending.filter((event) => !this.done.has(event.id));
    this.done.clear();
    for (const event of this.pending) {
      const target = requestedState(event);
      if (target === undefined) continue;
      // A stop stored before this session began was meant for a run that is over.
      if (target === null || (target === 'stopped' && event.id < this.loadingEventId)) {
        this.done.add(event.id);
        continue;
      }
      return { kind: 'control', event, target };
    }
    if (this.currentState === 'paused') return null;
    const message = this.pending.find((event) => isUserMessage(event));
    if (this.suspended && (!message || message.id === this.suspended.trigger.id)) {
      // The suspended turn's own message waits for the user's answer.
      const others = this.pending.find(
        (e) => isUserMessage(e) && e.id !== this.suspended?.trigger.id,
      );
      return others ? { kind: 'message', event: others } : null;
    }
    if (message) return { kind: 'message', event: message };
    for (const event of this.pending) this.done.add(event.id);
    return null;
  }

  private async applyControl(event: StoredEvent, target: Control): Promise<void> {
    const cause = event.id;
    if (target === 'user_confirmed' || target === 'user_rejected') {
      const suspended = this.suspended;
      if (!suspended) {
        this.done.add(cause); // nothing awaits an answer
        return;
      }
      await this.write([agentStateChangeDraft(target, { cause })]);
      this.done.add(cause);
      this.suspended = null;
      suspended.confirm(target === 'user_confirmed' ? 'confirmed' : 'rejected');
      await this.drive(suspended);
      return;
    }
    if (target === 'stopped') {
      await this.endSuspended('The conversation was stopped before the calls were confirmed.');
      await this.write([agentStateChangeDraft('stopped', { cause })]);
      this.endReason ??= 'stopped';
      this.beginClosing();
    } else if (target === 'paused') {
      await this.write([agentStateChangeDraft('paused', { cause })]);
    } else {
      await this.write([
        agentStateChangeDraft(
          this.suspended ? 'awaiting_user_confirmation' : 'awaiting_user_input',
          { cause },
        ),
      ]);
    }
    this.done.add(cause);
  }

  // ---------------------------------------------------------------- turns

  private async runTurn(trigger: StoredEvent): Promise<void> {
    // A new message while calls await confirmation rejects them and ends that turn.
    await this.endSuspended('A new message came before the calls were confirmed.');
    const attempts = (this.attempts.get(trigger.id) ?? 0) + 1;
    if (attempts > MAX_TURN_ATTEMPTS) {
      await this.settleInError(trigger.id, STORE_FAILED_MESSAGE);
      return;
    }
    this.attempts.set(trigger.id, attempts);
    // A message stored before this run began may have been worked on by an earlier holder.
    const resumed = trigger.id < this.loadingEventId;
    const trace = this.traces.get(trigger.id);
    this.traces.delete(trigger.id);
    await this.tracing.withRemoteParent(
      trace,
      'agent turn',
      async () => {
        const progress = resumed
          ? readTurnProgress(trigger, await this.readAfter(trigger.id))
          : emptyProgress();
        await this.drive(this.newRunner(trigger, progress, !resumed));
      },
      { 'cs.conversation_id': this.ref.conversationId, 'cs.event_id': trigger.id },
    );
  }

  /** Runs a turn until it settles, waits for a confirmation or is cut; stores what the cut means. */
  private async drive(runner: TurnRunner): Promise<void> {
    const trigger = runner.trigger;
    const turn: ActiveTurn = {
      runner,
      controller: new AbortController(),
      cut: null,
      runningStored: false,
      writes: Promise.resolve(),
      runningTimer: undefined,
    };
    this.turn = turn;
    if (this.wakePending) void this.checkForInterruption();
    turn.runningTimer = setTimeout(() => {
      this.writeInTurn(turn, []).catch(() => undefined);
    }, RUNNING_DEFER_MS);
    try {
      // Under `reject` the door reads `running` to refuse a second message: store it first.
      if (this.strategy === 'reject') await this.writeInTurn(turn, []);
      const outcome = await runner.run(turn.controller.signal);
      clearTimeout(turn.runningTimer);
      await turn.writes.catch(() => undefined);
      if (outcome.kind === 'settled') {
        this.settled(trigger.id);
        if (outcome.answered) void this.giveTitle(runner);
      } else if (outcome.kind === 'awaiting_confirmation') {
        this.suspended = runner;
        if (this.currentState !== 'awaiting_user_confirmation') {
          await this.write([
            agentStateChangeDraft('awaiting_user_confirmation', { cause: trigger.id }),
          ]);
        }
      } else if (turn.cut === 'control' || turn.cut === 'interrupt' || turn.cut === 'stop') {
        // Stop, pause or a newer message: the turn ends here, its text kept as interrupted.
        await runner.end(
          'The turn was interrupted before this call ran.',
          outcome.partialText,
          'interrupted',
          (drafts) => this.write(drafts, turn.cut === 'stop'),
        );
        this.settled(trigger.id);
      }
    } catch (error) {
      if (!isRefusedWrite(error)) throw error;
      // The store refuses what the agent produced (a NUL, a lone surrogate,
      // too large): trying again would produce it again. The turn ends here.
      this.reportError(`the store refused an output of ${this.ref.conversationId}`, error);
      await this.settleInError(trigger.id, OUTPUT_REFUSED_MESSAGE);
    } finally {
      clearTimeout(turn.runningTimer);
      turn.controller.abort();
      await turn.writes.catch(() => undefined);
      if (this.turn === turn) this.turn = null;
    }
  }

  private newRunner(
    trigger: StoredEvent,
    progress: ReturnType<typeof emptyProgress>,
    own: boolean,
  ): TurnRunner {
    const settings = this.record?.settings;
    const config = this.record?.agent.config ?? {};
    const tools = Array.isArray(config['tools'])
      ? (config['tools'] as unknown[]).filter((t): t is string => typeof t === 'string')
      : undefined;
    const model = typeof config['model'] === 'string' ? config['model'] : undefined;
    const budget = this.options.maxBudgetUsd ?? 0;
    const runner: TurnRunner = new TurnRunner(
      {
        ref: this.ref,
        store: this.store,
        agent: this.agent,
        tools: this.tools,
        metrics: this.options.metrics ?? NO_RUNTIME_METRICS,
        tracing: this.tracing,
        settings: {
          maxIterations: Math.min(this.options.maxIterations, settings?.maxIterations ?? Infinity),
          maxBudgetUsd:
            budget > 0
              ? Math.min(budget, settings?.maxBudgetUsd ?? Infinity)
              : (settings?.maxBudgetUsd ?? 0),
          confirmationMode: settings?.confirmationMode ?? false,
          allowedTools: tools,
          price: (usage) => this.options.price?.(model, usage) ?? 0,
        },
        cache: this.cache,
        write: (drafts) =>
          this.turn?.runner === runner ? this.writeInTurn(this.turn, drafts) : this.write(drafts),
        publishStatus: (status) =>
          this.safely(() => this.broadcaster.publishStatus(this.room, status)),
        publishStream: (delta) =>
          this.safely(() => this.broadcaster.publishStream(this.room, delta)),
        state: () => ({ ...this.state }),
        instructions: () => this.record?.instructions ?? null,
        lastEventId: () => this.nextId - 1,
        reportError: this.reportError,
      },
      trigger,
      progress,
      own,
    );
    return runner;
  }

  private settled(messageId: number): void {
    this.done.add(messageId);
    this.attempts.delete(messageId);
  }

  private async endSuspended(why: string): Promise<void> {
    const suspended = this.suspended;
    if (!suspended) return;
    this.suspended = null;
    await suspended.end(why, '', 'superseded', (drafts) => this.write(drafts));
    this.settled(suspended.trigger.id);
  }

  private async settleInError(messageId: number, message: string): Promise<void> {
    await this.write([
      agentStateChangeDraft('error', {
        cause: messageId,
        answers: messageId,
        reason: AGENT_ERROR_REASON,
        message,
      }),
    ]);
    this.settled(messageId);
    this.safely(() =>
      this.broadcaster.publishStatus(this.room, {
        status_update: true,
        type: 'error',
        id: StatusId.AgentError,
        message,
      }),
    );
  }

  /** An untitled conversation gets a title after its first answer (PROTOCOL.md "Titles"). */
  private async giveTitle(runner: TurnRunner): Promise<void> {
    if (this.titled) return;
    this.titled = true;
    try {
      let title = '';
      if (this.agent.title) {
        try {
          title = (await this.agent.title(runner.titleContext())).title.trim().slice(0, 200);
        } catch (error) {
          this.reportError('the agent could not make a title', error);
        }
      }
      if (title === '') title = fallbackTitle(await this.firstUserMessage(runner.trigger));
      if (title === '' || this.closing) return;
      await this.store.updateConversation(this.ref.tenantId, this.ref.conversationId, { title });
      this.safely(() =>
        this.broadcaster.publishStatus(this.room, {
          status_update: true,
          type: 'info',
          id: StatusId.TitleUpdated,
          message: title,
        }),
      );
    } catch (error) {
      this.reportError('could not store a title', error);
    }
  }

  private async firstUserMessage(trigger: StoredEvent): Promise<string> {
    const first =
      (
        await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
          fromId: 0,
          toId: trigger.id,
          limit: 200,
        })
      ).find(isUserMessage) ?? trigger;
    return isAction(first) && typeof first.args['content'] === 'string'
      ? first.args['content']
      : '';
  }

  /** Mid-turn: a pause or stop (or, under `interrupt`, a newer message) cuts the turn at once. */
  private async checkForInterruption(): Promise<void> {
    try {
      if (this.unread) await this.sync();
    } catch {
      return; // the loop's next read retries
    }
    const turn = this.turn;
    if (!turn) return;
    const strategy = this.strategy;
    for (const event of this.pending) {
      if (this.done.has(event.id) || event.id <= turn.runner.trigger.id) continue;
      const target = requestedState(event);
      if (target === 'paused' || (target === 'stopped' && event.id > this.loadingEventId)) {
        turn.cut ??= 'control';
      } else if (strategy === 'interrupt' && isUserMessage(event)) {
        turn.cut ??= 'interrupt';
      }
    }
    if (turn.cut) turn.controller.abort();
  }

  // ---------------------------------------------------------------- store i/o

  /** Appends a turn's events after its earlier writes, with `running` first if not stored yet. */
  private writeInTurn(turn: ActiveTurn, drafts: EventDraft[]): Promise<StoredEvent[]> {
    const write = turn.writes.then(() => {
      const batch = turn.runningStored
        ? drafts
        : [agentStateChangeDraft('running', { cause: turn.runner.trigger.id }), ...drafts];
      turn.runningStored = true;
      return batch.length > 0 ? this.write(batch, turn.cut === 'stop') : [];
    });
    turn.writes = write;
    return write;
  }

  /** Appends with the lease epoch, then updates what the session knows and publishes. */
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
    for (const draft of drafts)
      if (draft.stateDelta) this.state = applyDelta(this.state, draft.stateDelta);
    for (const event of events) {
      const change = readAgentStateChange(event);
      if (change) this.currentState = change.agentState;
      this.cache.put(event);
    }
    // A user event stored in between, not seen yet, leaves a gap: read it first.
    if (!this.accept(events)) this.unread = true;
    this.safely(() => this.broadcaster.publishEvents(this.room, events));
    return events;
  }

  /** The events stored after `id` (a resumed turn's progress). */
  private async readAfter(id: number): Promise<StoredEvent[]> {
    const events: StoredEvent[] = [];
    for (let from = id + 1; from < this.nextId;) {
      const page = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
        fromId: from,
        toId: this.nextId - 1,
        limit: this.pageSize,
      });
      if (page.length === 0) break;
      events.push(...page);
      from = page[page.length - 1]!.id + 1;
    }
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
          for (;;) {
            const page = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
              fromId: this.nextId,
              limit: this.pageSize,
            });
            if (!this.accept(page) || page.length < this.pageSize) break;
          }
        } while (this.syncAgain && !this.finished);
      } finally {
        this.syncRun = null;
      }
    })();
    return this.syncRun;
  }

  /** Takes stored events in id order: known ones skipped, a gap stops it (false). */
  private accept(events: readonly StoredEvent[]): boolean {
    for (const event of events) {
      if (event.id < this.nextId) continue;
      if (event.id > this.nextId) return false;
      this.nextId = event.id + 1;
      this.cache.put(event);
      if (event.source === 'user') {
        this.pending.push(event);
        this.activityAt = this.clock.now();
        continue;
      }
      // A control applied, or a turn settled, by an earlier holder or by a
      // write of this one whose answer was lost: its state change names it.
      const change = readAgentStateChange(event);
      const cause = event.cause;
      if (!change || cause === undefined) continue;
      const settled = this.pending.find((e) => e.id === cause);
      if (!settled) continue;
      const isTurn = isUserMessage(settled);
      if (isTurn ? settlesTurn(change.agentState) : isSettledState(change.agentState)) {
        this.done.add(cause);
      }
    }
    return true;
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

  private beginClosing(): void {
    this.closing = true;
    this.poll?.cancel();
    if (this.turn) {
      this.turn.cut ??= 'close';
      this.turn.controller.abort();
    }
    this.releaseWaiter();
    this.backoffWaiter?.();
  }

  private loseLease(): void {
    this.writable = false;
    this.endReason = 'lease_lost';
    this.beginClosing();
  }

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

function defaultTools(): ToolRegistry {
  const registry = new ToolRegistry(30_000);
  for (const [name, tool] of Object.entries(BUILTIN_TOOLS)) registry.add(name, tool);
  return registry;
}

/** The control a `change_agent_state` user event asks for; null if malformed, undefined if not one. */
function requestedState(event: StoredEvent): Control | null | undefined {
  if (!isAction(event) || event.action !== 'change_agent_state') return undefined;
  const target = event.args['agent_state'];
  return target === 'stopped' ||
    target === 'paused' ||
    target === 'running' ||
    target === 'user_confirmed' ||
    target === 'user_rejected'
    ? target
    : null;
}

/** The states a turn's last batch moves to (not a confirmation, nor a pause). */
function settlesTurn(state: AgentState): boolean {
  return state === 'awaiting_user_input' || state === 'finished' || state === 'error';
}

function isUserMessage(event: StoredEvent): boolean {
  return event.source === 'user' && isAction(event) && event.action === 'message';
}

/** A write the store refused for what it holds: the same write would be refused again. */
function isRefusedWrite(error: unknown): boolean {
  return error instanceof DomainError && error.code === 'BAD_REQUEST';
}
