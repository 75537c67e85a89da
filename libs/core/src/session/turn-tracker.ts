/**
 * Where the turn that handles one user event stands, read from the events
 * stored after it (docs/protocol.md "Waiting for an answer over REST"): the REST
 * wait and `GET …/turns/:event_id` both feed it the conversation's events in
 * id order and read its status.
 *
 * A turn's events are those whose `cause` is the user event, or an event of
 * the turn (a tool result's cause is its call): messages queued meanwhile and
 * other turns' events are not part of it. Its state changes (`cause` = the
 * user event) say where it is: `running` while it works, a settled state
 * once it ended; every way a turn ends (answer, error, stop, pause,
 * interrupt, rejection) stores such a settled change with its trigger as
 * cause (turn-runner.ts), which is what makes this reading exact.
 *
 * A rewind (docs/protocol.md "Branching") to before the user event makes the turn
 * `undone`, for good; one to the user event itself (a regenerate) starts the
 * turn afresh; one into the turn drops what it undid. Events read back with
 * `undone_by` are not the turn's.
 */
import {
  readAgentState,
  rewindTarget,
  type AgentState,
  type StoredEvent,
  type TurnResponse,
} from '@cs/protocol';

export type TurnStatus = TurnResponse['status'];

export class TurnTracker {
  private own = new Set<number>();
  private stored: StoredEvent[] = [];
  private current: TurnStatus = 'pending';
  private state: AgentState | null = null;

  constructor(readonly eventId: number) {
    this.own.add(eventId);
  }

  get status(): TurnStatus {
    return this.current;
  }

  /** The agent state the turn's last state change set (null before its first). */
  get agentState(): AgentState | null {
    return this.state;
  }

  /** What the turn stored so far, in id order. */
  get events(): readonly StoredEvent[] {
    return this.stored;
  }

  /**
   * Whether a waiter may answer: the turn ended, or awaits the user's
   * confirmation (it goes on once the user answers).
   */
  get answered(): boolean {
    return this.current !== 'pending' && this.current !== 'running';
  }

  /** Whether the turn is over for good: no later event changes its status. */
  get ended(): boolean {
    return this.current === 'completed' || this.current === 'error' || this.current === 'undone';
  }

  /** Takes the conversation's next event (ids increasing; earlier ones are ignored). */
  add(event: StoredEvent): void {
    if (event.id <= this.eventId || this.current === 'undone' || event.undone_by !== undefined)
      return;
    const target = rewindTarget(event);
    if (target !== null) {
      this.rewound(target);
      return;
    }
    if (this.ended) return;
    const cause = event.cause;
    if (cause === undefined || !this.own.has(cause)) return;
    this.own.add(event.id);
    this.stored.push(event);
    const state = readAgentState(event);
    if (state === null) {
      // Anything the turn stores means it works: before its `running` (stored
      // with the turn's first write), or again once the user confirmed.
      this.current = 'running';
      return;
    }
    this.state = state;
    this.current = statusOf(state);
  }

  /** A rewind to `target`: the turn is undone, starts again, or loses what came after `target`. */
  private rewound(target: number): void {
    if (target < this.eventId) {
      this.current = 'undone';
      return;
    }
    this.stored = this.stored.filter((event) => event.id <= target);
    this.own = new Set([this.eventId, ...this.stored.map((event) => event.id)]);
    const last = this.stored
      .map(readAgentState)
      .filter((state) => state !== null)
      .at(-1);
    this.state = last ?? null;
    this.current =
      last !== undefined ? statusOf(last) : this.stored.length > 0 ? 'running' : 'pending';
  }
}

/**
 * `user_confirmed` and `user_rejected` are caused by the user's answer
 * itself, never by a message: the answer's own "turn" ends there (the calls'
 * turn goes on as the message's).
 */
function statusOf(state: AgentState): TurnStatus {
  switch (state) {
    case 'loading':
    case 'running':
      return 'running';
    case 'awaiting_user_confirmation':
      return 'awaiting_user_confirmation';
    case 'error':
      return 'error';
    default:
      return 'completed';
  }
}
