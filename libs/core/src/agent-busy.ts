/**
 * When the agent is busy, for the `reject` strategy (docs/protocol.md "A message
 * sent while a turn runs"): a turn runs, or a user message stored after
 * `answered_through` waits for its turn. A turn whose tool calls await the
 * user's confirmation is not busy: a message then is the user's reply, it
 * rejects the pending calls and is answered next ("Human approval"); only a
 * second message, before the first is taken, finds the agent busy. A session
 * that is loading is not busy either: a message then is answered once it is
 * ready. One definition for the gateway's door and the stores' appends.
 */
import type { AgentState } from '@cs/protocol';

/** The agent states in which a turn is under way, whatever else is stored. */
export function isBusyState(state: AgentState | null): boolean {
  return state === 'running';
}

export interface BusyFacts<Count extends number | Promise<number>> {
  agentState: AgentState | null;
  /**
   * How many user messages after `answered_through` are stored, not answered
   * yet, counted up to 2 (asked only if it decides).
   */
  unansweredMessages: () => Count;
}

/** Busy or not; synchronous when `unansweredMessages` is. */
export function isAgentBusy(facts: BusyFacts<number>): boolean;
export function isAgentBusy(facts: BusyFacts<Promise<number>>): boolean | Promise<boolean>;
export function isAgentBusy(
  facts: BusyFacts<number | Promise<number>>,
): boolean | Promise<boolean> {
  if (isBusyState(facts.agentState)) return true;
  // Awaiting confirmation, the pending turn's own message is unanswered.
  const allowed = facts.agentState === 'awaiting_user_confirmation' ? 1 : 0;
  const count = facts.unansweredMessages();
  return typeof count === 'number' ? count > allowed : count.then((n) => n > allowed);
}
