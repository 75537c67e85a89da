/**
 * One turn: the steps that answer one user message. Each step's outcome is
 * stored before the next starts (tool calls before they run, their results
 * after), so a turn cut short anywhere goes on from its stored events on the
 * next holder without asking the agent again for what is stored: see
 * `readTurnProgress` (turn-progress.ts). The turn ends with an answer, `finish`, a limit, or an
 * error; it is suspended while tool calls await the user's confirmation.
 * Its tool calls are run, and answered when it ends early, by `TurnToolCalls`.
 */
import type { StatusUpdate, StoredEvent, TurnErrorReason } from '@cs/protocol';
import { isAction } from '@cs/protocol';
import { AgentTurnError } from '../agent.js';
import type { EventDraft } from '../conversation.js';
import {
  AGENT_ERROR_REASON,
  MAX_BUDGET_REASON,
  MAX_ITERATIONS_REASON,
  agentStateChangeDraft,
} from './agent-state-change.js';
import { DeltaStream } from './delta-stream.js';
import { runStep, type StepResult } from './step-runner.js';
import type { TurnDeps, TurnWrites } from './turn-deps.js';
import { TurnHistory } from './turn-history.js';
import { messageDraft, newToolCallId, withAccounting, type Accounting } from './turn-drafts.js';
import type { TurnProgress } from './turn-progress.js';
import { TurnToolCalls } from './turn-tool-calls.js';

export const AGENT_FAILED_MESSAGE = 'The agent failed to answer.';
export const MAX_ITERATIONS_MESSAGE = 'The agent took too many steps for this message.';
export const BUDGET_MESSAGE = 'The agent reached the budget for this message.';

/** How `run` left the turn. */
export type TurnOutcome =
  /** `answered`: a message with text was stored (an untitled conversation gets its title from it). */
  | { kind: 'settled'; answered: boolean }
  | { kind: 'awaiting_confirmation' }
  /** Aborted: nothing more was stored; the session decides what the cut means. */
  | { kind: 'interrupted'; partialText: string };

export class TurnRunner {
  private readonly calls: TurnToolCalls;

  constructor(
    private readonly deps: TurnDeps,
    readonly trigger: StoredEvent,
    readonly progress: TurnProgress,
  ) {
    this.calls = new TurnToolCalls(deps, progress);
  }

  /** Runs the turn from where its stored events leave it, until it settles, waits or is cut. */
  async run(turn: TurnWrites): Promise<TurnOutcome> {
    const { progress } = this;
    const { signal } = turn;
    if (progress.unresolved.length > 0) {
      if (progress.confirmation === 'awaiting') return { kind: 'awaiting_confirmation' };
      // Confirmed, rejected, or a failover in the middle of running them.
      await this.calls.resolve(
        progress.unresolved,
        progress.confirmation === 'rejected' ? 'rejected' : 'run',
        turn,
      );
      if (signal.aborted) return { kind: 'interrupted', partialText: '' };
    }
    for (;;) {
      // Cut before its next step (or before its first: see `TurnDriver.closing`).
      if (signal.aborted) return { kind: 'interrupted', partialText: '' };
      const { settings } = this.deps;
      if (progress.steps >= settings.maxIterations) {
        await this.settleInError(turn, MAX_ITERATIONS_REASON, MAX_ITERATIONS_MESSAGE, '');
        return { kind: 'settled', answered: false };
      }
      // Reached: the next step could only pass it.
      if (this.budgetSpent()) {
        await this.settleInError(turn, MAX_BUDGET_REASON, BUDGET_MESSAGE, '');
        return { kind: 'settled', answered: false };
      }
      // What another conversation of the user (or app) stored is seen from the next step on.
      await this.deps.conversation.refreshSharedState();
      const started = performance.now();
      const { outlet } = this.deps;
      const stream = new DeltaStream(this.trigger.id, (delta) => outlet.publishStream(delta));
      const step = await this.deps.tracing.withSpan(
        'agent step',
        () => runStep(this.deps.agent, this.context(signal, stream, progress.steps + 1), stream),
        { 'cs.step': progress.steps + 1 },
      );
      stream.close();
      this.deps.metrics.stepFinished((performance.now() - started) / 1000);
      const accounting = this.account(step);
      if (step.end === 'aborted') return { kind: 'interrupted', partialText: step.text };
      const outputs: EventDraft[] = step.events.map((event) => ({
        source: 'agent',
        body: event.body,
        cause: this.trigger.id,
        ...(event.stateDelta ? { stateDelta: event.stateDelta } : {}),
      }));
      if (step.end === 'failed') {
        this.deps.reportError(`the agent of ${this.deps.ref.conversationId} failed`, step.error);
        const { reason, message } = failureOf(step.error);
        // What the step stored before it failed stays (an HTTP agent's bad line, say).
        await this.settleInError(turn, reason, message, step.text, accounting, outputs);
        return { kind: 'settled', answered: false };
      }
      if (step.toolCalls.length > 0 && !step.finished) {
        // The step's text goes with its first call, once.
        const calls: EventDraft[] = step.toolCalls.map((call, index) => ({
          source: 'agent',
          cause: this.trigger.id,
          body: {
            action: 'tool_call',
            args: {
              tool: call.tool,
              arguments: call.arguments,
              tool_call_id: call.tool_call_id ?? newToolCallId(),
            },
            message: index === 0 ? step.text : '',
          },
        }));
        const stored = await turn.append(withAccounting([...outputs, ...calls], accounting));
        for (const event of stored) progress.events.add(event.id);
        progress.steps += 1;
        const storedCalls = stored.filter(
          (event) => isAction(event) && event.action === 'tool_call',
        );
        // Stored, without a result: what a cut from here on leaves to answer (`end`).
        progress.unresolved = storedCalls;
        if (this.budgetSpent()) {
          // The step that spent the budget does not get its calls run.
          const neverRan = this.calls.unresolvedResults('The turn reached its budget');
          await this.settleInError(
            turn,
            MAX_BUDGET_REASON,
            BUDGET_MESSAGE,
            '',
            undefined,
            neverRan,
          );
          return { kind: 'settled', answered: false };
        }
        if (this.deps.conversation.confirmationMode) {
          progress.confirmation = 'awaiting';
          await turn.append([
            agentStateChangeDraft('awaiting_user_confirmation', { cause: this.trigger.id }),
          ]);
          return { kind: 'awaiting_confirmation' };
        }
        await this.calls.resolve(storedCalls, 'run', turn);
        if (signal.aborted) return { kind: 'interrupted', partialText: '' };
        continue;
      }
      // Exactly one message for a turn that ends with one, even an empty one; a
      // step that ends with nothing (or `finish`) and streamed nothing stores none.
      const answer: EventDraft[] =
        step.answered || step.text !== '' ? [messageDraft(this.trigger.id, step.text)] : [];
      const settle = agentStateChangeDraft(step.finished ? 'finished' : 'awaiting_user_input', {
        cause: this.trigger.id,
        answers: this.trigger.id,
        ...(step.finished?.reason ? { reason: step.finished.reason } : {}),
      });
      await turn.append(withAccounting([...outputs, ...answer, settle], accounting));
      return { kind: 'settled', answered: step.text !== '' };
    }
  }

  /** The user answered the pending calls: run them, or tell the agent they were rejected. */
  confirm(decision: 'confirmed' | 'rejected'): void {
    this.progress.confirmation = decision;
  }

  /**
   * Ends the turn now (a stop, a pause, an interrupt, a new message while
   * calls awaited confirmation): its partial text stored as interrupted, and
   * each call without a result answered with an error that says `why` (the
   * opening of a sentence) and whether it was cut while it ran or never ran,
   * in the same write as the state change that settles the turn, straight
   * to the session (the turn runs no more); `final` for a stop's last writes
   * while the session closes, `rejected` when that is the user's rejection
   * of calls awaiting confirmation.
   */
  async end(
    why: string,
    partialText: string,
    reason: string,
    { final = false, rejected = false }: { final?: boolean; rejected?: boolean } = {},
  ): Promise<void> {
    const drafts: EventDraft[] = [];
    if (partialText !== '') drafts.push(messageDraft(this.trigger.id, partialText, true));
    drafts.push(...this.calls.unresolvedResults(why, rejected));
    drafts.push(
      agentStateChangeDraft('awaiting_user_input', {
        cause: this.trigger.id,
        answers: this.trigger.id,
        reason,
      }),
    );
    await this.deps.outlet.write(drafts, final);
  }

  /** The turn cost what it may (`maxBudgetUsd`, 0: no limit): no step or call may follow. */
  private budgetSpent(): boolean {
    const { maxBudgetUsd } = this.deps.settings;
    return maxBudgetUsd > 0 && this.progress.costUsd >= maxBudgetUsd;
  }

  /** A context for a request outside the turn's steps (a title), never aborted. */
  titleContext(): ReturnType<TurnRunner['context']> {
    const stream = new DeltaStream(this.trigger.id, () => undefined);
    return this.context(new AbortController().signal, stream, this.progress.steps + 1);
  }

  // ------------------------------------------------------------- internals

  private context(signal: AbortSignal, stream: DeltaStream, step: number) {
    const { deps } = this;
    return {
      conversation_id: deps.ref.conversationId,
      tenant_id: deps.ref.tenantId,
      user_id: deps.ref.userId,
      trigger: this.trigger,
      state: deps.conversation.state.current,
      instructions: deps.conversation.instructions,
      tools: deps.tools.describe(deps.settings.allowedTools),
      signal,
      history: new TurnHistory(
        deps.store,
        deps.ref,
        this.trigger,
        this.progress.events,
        deps.queue.lastEventId,
        deps.cache,
      ),
      step,
      notify: (status: Omit<StatusUpdate, 'status_update'>) => {
        // A retried model request starts its text afresh.
        if (status.id === 'STATUS$LLM_RETRY') stream.restart();
        deps.outlet.publishStatus({ status_update: true, ...status });
      },
    };
  }

  /** Adds up a step's usage: the turn's cost, the metrics drafts carry. */
  private account(step: StepResult): Accounting {
    let prompt = 0;
    let completion = 0;
    let cost = 0;
    for (const usage of step.usage) {
      prompt += usage.promptTokens;
      completion += usage.completionTokens;
      cost += usage.costUsd ?? this.deps.settings.price(usage);
    }
    this.progress.costUsd += cost;
    if (prompt + completion > 0) this.deps.metrics.tokensUsed(prompt, completion);
    return {
      metrics: {
        iterations: 1,
        prompt_tokens: prompt,
        completion_tokens: completion,
        cost_usd: cost,
      },
      state: step.stateDelta,
      ...(step.usage.length > 0
        ? {
            usage: {
              model: this.deps.settings.usageModel,
              promptTokens: prompt,
              completionTokens: completion,
              costUsd: cost,
              requests: step.usage.length,
            },
          }
        : {}),
    };
  }

  private async settleInError(
    turn: TurnWrites,
    reason: TurnErrorReason,
    message: string,
    partialText: string,
    accounting?: Accounting,
    events: EventDraft[] = [],
  ): Promise<void> {
    const drafts: EventDraft[] = [...events];
    if (partialText !== '') drafts.push(messageDraft(this.trigger.id, partialText, true));
    drafts.push(
      agentStateChangeDraft('error', {
        cause: this.trigger.id,
        answers: this.trigger.id,
        reason,
        message,
      }),
    );
    await turn.append(accounting ? withAccounting(drafts, accounting) : drafts);
    this.deps.outlet.publishStatus({
      status_update: true,
      type: 'error',
      id: 'AGENT_ERROR$ERROR',
      message,
    });
  }
}

/** What users see of a failed step: the agent's reason of the contract, or a generic one. */
function failureOf(error: unknown): { reason: TurnErrorReason; message: string } {
  if (error instanceof AgentTurnError) return { reason: error.reason, message: error.safeMessage };
  return { reason: AGENT_ERROR_REASON, message: AGENT_FAILED_MESSAGE };
}
