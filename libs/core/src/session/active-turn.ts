/**
 * The turn a session is running: its runner, the signal that cuts it and
 * why, and its writes in order. `running` is stored with the turn's first
 * write, or on its own once the turn has taken `RUNNING_DEFER_MS`: a turn
 * that answers sooner stores `running` in the same transaction as its answer,
 * one durable write fewer per turn.
 */
import type { StoredEvent } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';
import { agentStateChangeDraft } from './agent-state-change.js';
import type { SessionOutlet } from './session-outlet.js';
import type { TurnWrites } from './turn-deps.js';
import type { TurnRunner } from './turn-runner.js';

const RUNNING_DEFER_MS = 20;
/** What a turn's signal gives as its reason: made once, not at each cut. */
const TURN_CUT = new DOMException('The turn was cut.', 'AbortError');

/**
 * Why a running turn was cut: a user's pause or stop read from the store, a
 * newer message (`interrupt`), the session's `stop()` (a stop, an eviction:
 * its last writes go through while it closes), or the session closing
 * without writing (the next holder goes on with the turn).
 */
export type Cut = 'pause' | 'stop_request' | 'interrupt' | 'stop' | 'close';

export class ActiveTurn implements TurnWrites {
  /**
   * The agent's and its tools' signal: aborted when the turn is cut (stop,
   * pause, interrupt, lease loss, shutdown) and never when it ends otherwise,
   * so that an agent's abort handlers (a rollback) run only when its work was
   * cut. A finished turn holds nothing this signal would have to release: the
   * step runner returns an unfinished agent iterator, and a tool's own
   * timeout ends its call.
   */
  private readonly cutSignal = new AbortController();
  private why: Cut | null = null;
  private runningStored = false;
  private writes: Promise<unknown> = Promise.resolve();
  private runningTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly runner: TurnRunner,
    /** The session's way out: its appends, where this turn's go once in order. */
    private readonly outlet: SessionOutlet,
  ) {}

  get cut(): Cut | null {
    return this.why;
  }

  /** Cuts the turn (the first reason wins) and fires its signal. */
  cutBy(why: Cut): void {
    this.why ??= why;
    this.abort();
  }

  get signal(): AbortSignal {
    return this.cutSignal.signal;
  }

  /** Fires the turn's signal (once): only for a cut. */
  abort(): void {
    if (!this.cutSignal.signal.aborted) this.cutSignal.abort(TURN_CUT);
  }

  /** Only notes why, for a cut that a later `abort` carries out. */
  markCut(why: Cut): void {
    this.why ??= why;
  }

  /** Stores `running` if the turn is still going after the defer time. */
  deferRunning(): void {
    this.runningTimer = setTimeout(() => {
      this.append([]).catch(() => undefined);
    }, RUNNING_DEFER_MS);
  }

  /** Appends after the turn's earlier writes, with `running` first if not stored yet. */
  append(drafts: EventDraft[]): Promise<StoredEvent[]> {
    const write = this.writes.then(() => {
      const batch = this.runningStored
        ? drafts
        : [agentStateChangeDraft('running', { cause: this.runner.trigger.id }), ...drafts];
      this.runningStored = true;
      return batch.length > 0 ? this.outlet.write(batch, this.why === 'stop') : [];
    });
    this.writes = write;
    return write;
  }

  /** The runner is done: no deferred `running` any more, and its writes have settled. */
  async settle(): Promise<void> {
    clearTimeout(this.runningTimer);
    await this.writes.catch(() => undefined);
  }

  /** The turn is over, however it ended; its signal fires only if it was cut. */
  async end(): Promise<void> {
    clearTimeout(this.runningTimer);
    await this.writes.catch(() => undefined);
  }
}
