/**
 * What a session has read of its conversation and has still to handle: the
 * stored events arrive in id order (from its reads, its own writes and
 * wake-ups), the user events among them queue, and a state change that
 * settles one (stored by an earlier holder, or by a write of this session
 * whose answer was lost) marks it done as it is read. The next piece of work
 * is chosen here, without I/O: controls first, then the oldest message.
 */
import { isAction } from '@cs/protocol';
import type { AgentState, StoredEvent } from '@cs/protocol';
import { isSettledState, readAgentStateChange } from './agent-state-change.js';
import type { RecentEvents } from './turn-history.js';

/** The states a `change_agent_state` user event may ask for. */
export type Control = 'stopped' | 'paused' | 'running' | 'user_confirmed' | 'user_rejected';

export type Work =
  | { kind: 'control'; event: StoredEvent; target: Control }
  | { kind: 'message'; event: StoredEvent };

/** What the choice of the next work depends on besides the queue. */
export interface WorkContext {
  paused: boolean;
  /** The message of the turn whose tool calls await the user's confirmation, if any. */
  suspendedTrigger: number | null;
  /** This session's `loading` event: a stop stored before it was meant for an earlier run. */
  loadingEventId: number;
}

export class UserEventQueue {
  /** The id the next stored event will have: everything before it was read. */
  private next = 0;
  /** User events read and not yet handled, in id order. */
  private pending: StoredEvent[] = [];
  /** Pending user events settled (controls applied, messages answered) or skipped. */
  private readonly done = new Set<number>();

  constructor(
    private readonly cache: RecentEvents,
    /** Called for each user event read (it counts as activity). */
    private readonly onUserEvent: () => void = () => undefined,
  ) {}

  /** Id of the newest event read; -1 before any. */
  get lastEventId(): number {
    return this.next - 1;
  }

  get nextId(): number {
    return this.next;
  }

  /** Reading starts after `id` (the conversation's `answered_through`): all before it is settled. */
  startAfter(id: number): void {
    this.next = id + 1;
  }

  /** Takes stored events in id order: known ones skipped, a gap stops it (false). */
  accept(events: readonly StoredEvent[]): boolean {
    for (const event of events) {
      if (event.id < this.next) continue;
      if (event.id > this.next) return false;
      this.next = event.id + 1;
      this.cache.put(event);
      // Undone by a rewind: neither work to do nor a settlement (docs/protocol.md "Branching").
      if (event.undone_by !== undefined) continue;
      if (event.source === 'user') {
        this.pending.push(event);
        this.onUserEvent();
        continue;
      }
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

  markDone(id: number): void {
    this.done.add(id);
  }

  /** The user events still to handle that were stored after `id`. */
  pendingAfter(id: number): StoredEvent[] {
    return this.pending.filter((event) => event.id > id && !this.done.has(event.id));
  }

  /** Controls first (in id order), then the oldest message unless paused or awaiting a confirmation. */
  nextWork(context: WorkContext): Work | null {
    this.pending = this.pending.filter((event) => !this.done.has(event.id));
    this.done.clear();
    for (const event of this.pending) {
      const target = requestedState(event);
      if (target === undefined) continue;
      if (target === null || (target === 'stopped' && event.id < context.loadingEventId)) {
        this.done.add(event.id);
        continue;
      }
      return { kind: 'control', event, target };
    }
    if (context.paused) return null;
    const messages = this.pending.filter(isUserMessage);
    if (context.suspendedTrigger !== null) {
      // The suspended turn's own message waits for the user's answer.
      const other = messages.find((e) => e.id !== context.suspendedTrigger);
      return other ? { kind: 'message', event: other } : null;
    }
    if (messages[0]) return { kind: 'message', event: messages[0] };
    for (const event of this.pending) this.done.add(event.id);
    return null;
  }
}

/** The control a `change_agent_state` user event asks for; null if malformed, undefined if not one. */
export function requestedState(event: StoredEvent): Control | null | undefined {
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

export function isUserMessage(event: StoredEvent): boolean {
  return event.source === 'user' && isAction(event) && event.action === 'message';
}
