/**
 * A turn's stored tool calls: each run (or answered as rejected, or in doubt
 * after a failover) with its result stored as it comes; and the results that
 * answer the calls left without one when the turn ends early.
 */
import type { StoredEvent } from '@cs/protocol';
import { isAction } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';
import { resultDraft, toolOf } from './turn-drafts.js';
import type { TurnProgress } from './turn-progress.js';
import type { TurnDeps, TurnWrites } from './turn-deps.js';

export class TurnToolCalls {
  /**
   * The calls an earlier holder may have begun running: those it stored
   * without a result and did not leave awaiting a confirmation (a call
   * awaiting one never started, wherever it is confirmed). A call that may
   * have run is not run again unless its tool is idempotent: it is in doubt.
   */
  private readonly mayHaveRun: ReadonlySet<number>;
  /** The call that was running when the turn was cut, if one was. */
  private cutMidCall: number | null = null;

  constructor(
    private readonly deps: Pick<TurnDeps, 'ref' | 'tools' | 'metrics' | 'tracing' | 'settings'>,
    private readonly progress: TurnProgress,
  ) {
    this.mayHaveRun = new Set(
      progress.confirmation === 'awaiting' ? [] : progress.unresolved.map((call) => call.id),
    );
  }

  /** Runs (or resolves otherwise) tool calls, each result stored as it comes. */
  async resolve(
    calls: readonly StoredEvent[],
    how: 'run' | 'rejected',
    turn: TurnWrites,
  ): Promise<void> {
    const { tools, metrics } = this.deps;
    const { signal } = turn;
    const pending = [...calls];
    while (pending.length > 0 && !signal.aborted) {
      const call = pending.shift()!;
      const args = isAction(call) ? call.args : {};
      const tool = toolOf(call);
      // Unique (conversations' tool_call_ids may repeat: `call_0`), and the same after a failover.
      const idempotencyKey = `${this.deps.ref.conversationId}:${call.id}`;
      let draft: EventDraft;
      if (how === 'rejected') {
        metrics.toolCalled(tools.labelOf(tool), 'rejected');
        draft = resultDraft(call, 'The user rejected this call.', {
          is_error: true,
          rejected: true,
        });
      } else if (this.mayHaveRun.has(call.id) && !tools.isIdempotent(tool)) {
        metrics.toolCalled(tools.labelOf(tool), 'in_doubt');
        draft = resultDraft(
          call,
          'This call was interrupted by a failover and is not run again: its effect is unknown.',
          {
            is_error: true,
            in_doubt: true,
          },
        );
      } else {
        const toolArgs = args['arguments'];
        const outcome = await this.deps.tracing.withSpan(`tool ${tools.labelOf(tool)}`, () =>
          tools.run(
            tool,
            typeof toolArgs === 'object' && toolArgs !== null && !Array.isArray(toolArgs)
              ? (toolArgs as Record<string, unknown>)
              : {},
            {
              signal,
              idempotency_key: idempotencyKey,
              conversation_id: this.deps.ref.conversationId,
            },
            this.deps.settings.allowedTools,
          ),
        );
        if (signal.aborted) {
          // Cut mid-call: unresolved, for `end` to answer, or for the next holder after a close.
          this.cutMidCall = call.id;
          break;
        }
        metrics.toolCalled(tools.labelOf(tool), outcome.outcome);
        draft = resultDraft(
          call,
          outcome.content,
          { is_error: outcome.isError },
          outcome.stateDelta,
        );
      }
      const [stored] = await turn.append([draft]);
      if (stored) this.progress.events.add(stored.id);
      this.progress.unresolved = this.progress.unresolved.filter((c) => c.id !== call.id);
    }
  }

  /**
   * A result for each stored call without one, saying `why` (the opening of
   * a sentence) and whether it was cut while it ran or never ran; the calls
   * are then answered.
   */
  unresolvedResults(why: string, rejected = false): EventDraft[] {
    const before =
      this.progress.confirmation === 'awaiting'
        ? 'before this call was confirmed'
        : 'before this call ran';
    const drafts = this.progress.unresolved.map((call) => {
      const cut = call.id === this.cutMidCall;
      this.deps.metrics.toolCalled(
        this.deps.tools.labelOf(toolOf(call)),
        cut ? 'cancelled' : 'not_run',
      );
      const content = cut
        ? `${why} while this call ran: it did not finish, and its effect may or may not have happened.`
        : `${why} ${before}: it never ran.`;
      return resultDraft(
        call,
        content,
        rejected && !cut ? { is_error: true, rejected } : { is_error: true },
      );
    });
    this.progress.unresolved = [];
    this.cutMidCall = null;
    return drafts;
  }
}
