/**
 * A session's controls, applied as its loop reaches them: a confirmation or
 * rejection answers the turn awaiting one, a stop ends that turn, stores
 * `stopped` and closes the session, a pause or resume stores the state asked for.
 */
import type { StoredEvent } from '@cs/protocol';
import { agentStateChangeDraft } from './agent-state-change.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { SessionOutlet } from './session-outlet.js';
import { STOPPED_WHY, type TurnDriver } from './turn-driver.js';
import type { Control, UserEventQueue } from './user-event-queue.js';

export class SessionControls {
  constructor(
    private readonly turns: TurnDriver,
    private readonly queue: UserEventQueue,
    private readonly lifecycle: SessionLifecycle,
    private readonly outlet: Pick<SessionOutlet, 'write'>,
  ) {}

  /** The user's control event `event`, asking for `target`; handled once this resolves. */
  async apply(event: StoredEvent, target: Control): Promise<void> {
    const cause = event.id;
    if (target === 'user_confirmed' || target === 'user_rejected') {
      // Nothing awaiting an answer: the control is spent.
      if (!(await this.turns.confirm(cause, target))) this.queue.markDone(cause);
      return;
    }
    if (target === 'stopped') {
      await this.storeStopped({ cause });
      this.lifecycle.endWith('stopped');
      this.lifecycle.beginClosing();
    } else if (target === 'paused') {
      await this.outlet.write([agentStateChangeDraft('paused', { cause })]);
    } else {
      await this.outlet.write([
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

  /**
   * Ends a turn awaiting confirmation (a stop is not a failover: its calls
   * are answered that they never ran) and stores `stopped`; `final` for the
   * last writes of `stop()`, while the session closes.
   */
  async storeStopped(extras: { cause?: number; reason?: string }, final = false): Promise<void> {
    await this.turns.endSuspended(STOPPED_WHY, { final });
    await this.outlet.write([agentStateChangeDraft('stopped', extras)], final);
  }
}
