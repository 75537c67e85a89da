/**
 * A session's turns: the one running (cut by a control, a newer message
 * under `interrupt`, or closing), the one whose tool calls await the user's
 * confirmation, and what a cut or a refused write leaves stored. A message
 * stored before the session began is resumed from its stored progress; the
 * agent runs at most `MAX_TURN_ATTEMPTS` times for a message whose turn could
 * not be stored.
 */
import { StatusId } from '@cs/protocol';
import type { StoredEvent } from '@cs/protocol';
import { DomainError } from '../errors.js';
import { NO_RUNTIME_METRICS } from '../ports/runtime-metrics.port.js';
import { ActiveTurn, type Cut } from './active-turn.js';
import { AGENT_ERROR_REASON, agentStateChangeDraft } from './agent-state-change.js';
import { titleConversation } from './conversation-title.js';
import type { EventReader } from './event-reader.js';
import type { SessionConversation } from './session-conversation.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { AgentSessionInit, AgentSessionOptions } from './session-options.js';
import type { SessionWriter } from './session-writer.js';
import type { RecentEvents } from './turn-history.js';
import { emptyProgress, readTurnProgress, type TurnProgress } from './turn-progress.js';
import { TurnRunner } from './turn-runner.js';
import { turnSettings } from './turn-settings.js';
import { isUserMessage, requestedState, type UserEventQueue } from './user-event-queue.js';
import type { ToolRegistry } from '../tools/tool-registry.js';
import type { Tracing } from '../ports/tracing.port.js';
import type { WakeSignal } from './wake-signal.js';

/** Times the agent runs for one message whose turn could not be stored; then it ends in error. */
const MAX_TURN_ATTEMPTS = 3;
/** Pending messages whose trace is remembered until their turn runs. */
const MAX_TRACES = 1_000;

/** What the calls of a turn a stop ends are told (the opening of a sentence). */
export const STOPPED_WHY = 'The conversation was stopped';
/** Why a cut ended the turn: the opening of what each of its unanswered calls is told. */
const CUT_ENDS_TURN: Partial<Record<Cut, string>> = {
  pause: 'The conversation was paused',
  stop_request: STOPPED_WHY,
  stop: STOPPED_WHY,
  interrupt: 'A new message interrupted the turn',
};

export const OUTPUT_REFUSED_MESSAGE = 'The agent produced an answer that could not be stored.';
export const STORE_FAILED_MESSAGE = 'The answer could not be stored; send the message again.';

/** What the turns need of their session. */
export interface TurnDriverDeps extends Pick<AgentSessionInit, 'store' | 'ref' | 'agent'> {
  options: AgentSessionOptions;
  tools: ToolRegistry;
  tracing: Tracing;
  cache: RecentEvents;
  queue: UserEventQueue;
  reader: EventReader;
  /** The session's way out (a `SessionOutlet`), and the agent state it stored last. */
  writer: SessionWriter;
  /** Its row, settings, state and `loading` event, as they are now. */
  conversation: SessionConversation;
  /** Closing: a title found then is not stored. */
  lifecycle: Pick<SessionLifecycle, 'isClosing'>;
  /** A wake-up came that the loop has not looked at (a control may be waiting). */
  wake: Pick<WakeSignal, 'isRaised'>;
  reportError: (message: string, error: unknown) => void;
}

export class TurnDriver {
  private turn: ActiveTurn | null = null;
  /** A turn whose tool calls await the user's confirmation. */
  private suspended: TurnRunner | null = null;
  private readonly attempts = new Map<number, number>();
  /** The trace each pending user message arrived in (by event id), until its turn runs. */
  private readonly traces = new Map<number, string>();
  /** An untitled conversation gets a title after its first answer, asked for once. */
  private titleAsked = false;
  /**
   * Why the session closes (`stop`, `close`), once it does: a turn that
   * begins after (its message taken just before, its settings still being
   * read) is cut as it begins, as it would have been had it begun first.
   */
  private closing: Cut | null = null;

  constructor(private readonly deps: TurnDriverDeps) {}

  get isRunning(): boolean {
    return this.turn !== null;
  }

  /** The message whose turn awaits a confirmation, if one does. */
  get suspendedTrigger(): number | null {
    return this.suspended?.trigger.id ?? null;
  }

  /** The user messages among `events` continue the trace `traceparent` when their turn runs. */
  rememberTrace(traceparent: string, events: readonly StoredEvent[]): void {
    for (const event of events) if (event.source === 'user') this.traces.set(event.id, traceparent);
    while (this.traces.size > MAX_TRACES)
      this.traces.delete(this.traces.keys().next().value as number);
  }

  /** The session closes: cuts the running turn, if any, and any that begins after (the first reason wins). */
  cutForClosing(why: Cut): void {
    this.closing ??= why;
    this.turn?.cutBy(why);
  }

  /** The session will close because of `why`: notes it for the cut that follows. */
  noteClosing(why: Cut): void {
    this.closing ??= why;
    this.turn?.markCut(why);
  }

  /** The user's answer to pending calls; false when nothing awaits one. */
  async confirm(cause: number, answer: 'user_confirmed' | 'user_rejected'): Promise<boolean> {
    const suspended = this.suspended;
    if (!suspended) return false;
    await this.deps.writer.write([agentStateChangeDraft(answer, { cause })]);
    this.deps.queue.markDone(cause);
    this.suspended = null;
    suspended.confirm(answer === 'user_confirmed' ? 'confirmed' : 'rejected');
    await this.drive(suspended);
    return true;
  }

  /**
   * Ends the turn awaiting a confirmation, each call answered that it never
   * ran because of `why` (the opening of a sentence); `final` for a stop's
   * last writes while the session closes, `rejected` when the user's new
   * message rejects the calls (docs/protocol.md "Human approval").
   */
  async endSuspended(why: string, { final = false, rejected = false } = {}): Promise<void> {
    const suspended = this.suspended;
    if (!suspended) return;
    this.suspended = null;
    await suspended.end(why, '', 'superseded', { final, rejected });
    this.settled(suspended.trigger.id);
  }

  async run(trigger: StoredEvent): Promise<void> {
    // A new message while calls await confirmation rejects them and ends that turn.
    await this.endSuspended('A new message came', { rejected: true });
    const attempts = (this.attempts.get(trigger.id) ?? 0) + 1;
    if (attempts > MAX_TURN_ATTEMPTS) {
      await this.settleInError(trigger.id, STORE_FAILED_MESSAGE);
      return;
    }
    this.attempts.set(trigger.id, attempts);
    // A message stored before this run began may have been worked on by an earlier holder.
    const resumed = trigger.id < this.deps.conversation.loadingEventId;
    const trace = this.traces.get(trigger.id);
    this.traces.delete(trigger.id);
    await this.deps.tracing.withRemoteParent(
      trace,
      'agent turn',
      async () => {
        const progress = resumed ? await this.storedProgress(trigger, attempts) : emptyProgress();
        // The strategy and the limits of this turn, as the conversation has them now.
        await this.deps.conversation.refreshSettings();
        await this.drive(this.newRunner(trigger, progress));
      },
      { 'cs.conversation_id': this.deps.ref.conversationId, 'cs.event_id': trigger.id },
    );
  }

  /**
   * What a turn an earlier holder worked on has stored: its events, and its
   * cost as the row counts it. The row this session started from says, unless
   * an earlier attempt of this session stored steps of the turn: read again.
   */
  private async storedProgress(trigger: StoredEvent, attempt: number): Promise<TurnProgress> {
    const { store, ref, reader, conversation } = this.deps;
    const [after, counted] = await Promise.all([
      reader.readAfter(trigger.id),
      attempt === 1
        ? (conversation.record?.turnCost ?? null)
        : store
            .getConversation(ref.tenantId, ref.conversationId)
            .then((fresh) => fresh?.turnCost ?? null),
    ]);
    return readTurnProgress(trigger, after, counted);
  }

  /** Mid-turn: a pause or stop (or, under `interrupt`, a newer message) cuts the turn at once. */
  async checkForInterruption(): Promise<void> {
    const { reader, queue } = this.deps;
    try {
      await reader.catchUp();
    } catch {
      return; // the loop's next read retries
    }
    const turn = this.turn;
    if (!turn) return;
    // A message sent after a PATCH to `interrupt` interrupts.
    const { conversation } = this.deps;
    await conversation.refreshSettings();
    const strategy = conversation.strategy;
    for (const event of queue.pendingAfter(turn.runner.trigger.id)) {
      const target = requestedState(event);
      if (target === 'paused') {
        turn.markCut('pause');
      } else if (target === 'stopped' && event.id > conversation.loadingEventId) {
        turn.markCut('stop_request');
      } else if (strategy === 'interrupt' && isUserMessage(event)) {
        turn.markCut('interrupt');
      }
    }
    if (turn.cut) turn.abort();
  }

  /** Runs a turn until it settles, waits for a confirmation or is cut; stores what the cut means. */
  private async drive(runner: TurnRunner): Promise<void> {
    const { deps } = this;
    const trigger = runner.trigger;
    const { writer, conversation } = deps;
    const turn = new ActiveTurn(runner, writer);
    this.turn = turn;
    if (this.closing) turn.cutBy(this.closing);
    // A newer message that came before this turn began (with its own, while
    // an earlier turn ran) cuts it under `interrupt` as one coming later would.
    const newerWaits =
      conversation.strategy === 'interrupt' &&
      deps.queue.pendingAfter(trigger.id).some(isUserMessage);
    if (deps.wake.isRaised || newerWaits) void this.checkForInterruption();
    turn.deferRunning();
    try {
      // Under `reject` the door reads `running` to refuse a second message: store it first.
      if (conversation.strategy === 'reject') await turn.append([]);
      const outcome = await runner.run(turn);
      await turn.settle();
      if (outcome.kind === 'settled') {
        this.settled(trigger.id);
        if (outcome.answered) void this.giveTitle(runner);
      } else if (outcome.kind === 'awaiting_confirmation') {
        this.suspended = runner;
        if (writer.agentState !== 'awaiting_user_confirmation') {
          await writer.write([
            agentStateChangeDraft('awaiting_user_confirmation', { cause: trigger.id }),
          ]);
        }
      } else {
        // Stop, pause or a newer message: the turn ends here, its text kept as
        // interrupted, its calls answered. A close leaves it to the next holder.
        const why = turn.cut ? CUT_ENDS_TURN[turn.cut] : undefined;
        if (why !== undefined) {
          await runner.end(why, outcome.partialText, 'interrupted', {
            final: turn.cut === 'stop',
          });
          this.settled(trigger.id);
        }
      }
    } catch (error) {
      if (!isRefusedWrite(error)) throw error;
      // The store refuses what the agent produced (a NUL, a lone surrogate,
      // too large): trying again would produce it again. The turn ends here.
      deps.reportError(`the store refused an output of ${deps.ref.conversationId}`, error);
      await this.settleInError(trigger.id, OUTPUT_REFUSED_MESSAGE);
    } finally {
      await turn.end();
      if (this.turn === turn) this.turn = null;
    }
  }

  private newRunner(trigger: StoredEvent, progress: TurnProgress): TurnRunner {
    const { deps } = this;
    return new TurnRunner(
      {
        ref: deps.ref,
        store: deps.store,
        agent: deps.agent,
        tools: deps.tools,
        metrics: deps.options.metrics ?? NO_RUNTIME_METRICS,
        tracing: deps.tracing,
        settings: turnSettings(deps.options, deps.conversation.record),
        conversation: deps.conversation,
        cache: deps.cache,
        queue: deps.queue,
        outlet: deps.writer,
        reportError: deps.reportError,
      },
      trigger,
      progress,
    );
  }

  private settled(messageId: number): void {
    this.deps.queue.markDone(messageId);
    this.attempts.delete(messageId);
  }

  private async settleInError(messageId: number, message: string): Promise<void> {
    await this.deps.writer.write([
      agentStateChangeDraft('error', {
        cause: messageId,
        answers: messageId,
        reason: AGENT_ERROR_REASON,
        message,
      }),
    ]);
    this.settled(messageId);
    this.deps.writer.publishStatus({
      status_update: true,
      type: 'error',
      id: StatusId.AgentError,
      message,
    });
  }

  private async giveTitle(runner: TurnRunner): Promise<void> {
    const { deps } = this;
    const { record } = deps.conversation;
    // Untitled as the session read it at start (`titleConversation` reads it again).
    if (this.titleAsked || record?.title !== '') return;
    this.titleAsked = true;
    const settings = turnSettings(deps.options, record);
    await titleConversation(
      {
        store: deps.store,
        ref: deps.ref,
        agent: deps.agent,
        outlet: deps.writer,
        reportError: deps.reportError,
        lifecycle: deps.lifecycle,
        price: settings.price,
        usageModel: settings.usageModel,
        metrics: deps.options.metrics ?? NO_RUNTIME_METRICS,
      },
      runner,
    );
  }
}

/** A write the store refused for what it holds: the same write would be refused again. */
function isRefusedWrite(error: unknown): boolean {
  return error instanceof DomainError && error.code === 'BAD_REQUEST';
}
