/**
 * The `agent_state_changed` observation as the runtime writes it (it is read
 * back with `readAgentStateChange` of libs/protocol, like everywhere else).
 * State changes are written with source `environment` (the runtime reports
 * them, the agent does not say them) and, when a user event caused them, with
 * `cause` = that event's id. A user event counts as handled once a state
 * change with its id as cause and a settled state (anything but `running` or
 * `loading`) is stored: that is what makes answers exactly-once across crashes.
 */
import { AGENT_STATE_CHANGED, type AgentState, type TurnErrorReason } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';

// Read back the one way every reader does (libs/protocol): re-exported for the domain.
export {
  AGENT_STATE_CHANGED,
  isSettledState,
  readAgentStateChange,
  type AgentStateChange,
} from '@cs/protocol';

/** The `extras.reason` of a turn ended by `maxIterations`. */
export const MAX_ITERATIONS_REASON: TurnErrorReason = 'max_iterations';
/** The `extras.reason` of a turn past its budget (`MAX_BUDGET_PER_TASK_USD`, `max_budget_usd`). */
export const MAX_BUDGET_REASON: TurnErrorReason = 'max_budget_exceeded';
/** The `extras.reason` of a turn whose agent threw. */
export const AGENT_ERROR_REASON: TurnErrorReason = 'agent_error';

export function agentStateChangeDraft(
  agentState: AgentState,
  options: { cause?: number; reason?: string; message?: string; answers?: number } = {},
): EventDraft {
  const { cause, reason, answers } = options;
  const message =
    options.message ?? `Agent state changed to ${agentState}${reason ? ` (${reason})` : ''}`;
  return {
    source: 'environment',
    body: {
      observation: AGENT_STATE_CHANGED,
      content: '',
      extras:
        reason === undefined ? { agent_state: agentState } : { agent_state: agentState, reason },
      message,
    },
    ...(cause === undefined ? {} : { cause }),
    ...(answers === undefined ? {} : { answers }),
  };
}

/**
 * The state a start settles at, after `previous` (the state before it):
 * paused stays paused, and tool calls awaiting the user's confirmation still
 * await it (the pending turn is taken up next); otherwise the agent awaits input.
 */
export function settledStateAfter(previous: AgentState | null): AgentState {
  if (previous === 'paused' || previous === 'awaiting_user_confirmation') return previous;
  return 'awaiting_user_input';
}
