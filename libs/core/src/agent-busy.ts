/**
 * When the agent is busy, for the `reject` strategy (PROTOCOL.md "Multitask
 * strategies"): a turn runs, tool calls await the user's confirmation, or a
 * user message stored after `answered_through` waits for its turn. A session
 * that is loading is not busy: a message then is answered once it is ready
 * (and a turn a new holder resumes has its message still unanswered). One
 * definition for the gateway's door and the stores' appends.
 */
import type { AgentState } from '@cs/protocol';

/** The agent states in which a turn is under way. */
export function isBusyState(state: AgentState | null): boolean {
  return state === 'running' || state === 'awaiting_user_confirmation';
}

export interface BusyFacts<Answer extends boolean | Promise<boolean>> {
  agentState: AgentState | null;
  /** Whether a user message after `answered_through` is stored, not answered yet (asked only if it decides). */
  hasUnansweredMessage: () => Answer;
}

/** Busy or not; synchronous when `hasUnansweredMessage` is. */
export function isAgentBusy<Answer extends boolean | Promise<boolean>>(
  facts: BusyFacts<Answer>,
): boolean | Answer {
  return isBusyState(facts.agentState) || facts.hasUnansweredMessage();
}
