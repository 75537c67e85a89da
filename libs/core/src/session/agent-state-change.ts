/**
 * The `agent_state_changed` observation: how it is written and read back.
 * State changes are written with source `environment` (the runtime reports
 * them, the agent does not say them) and, when a user event caused them, with
 * `cause` = that event's id. A user event counts as handled once a state
 * change with its id as cause and a settled state (anything but `running` or
 * `loading`) is stored: that is what makes answers exactly-once across crashes.
 */
import { AgentStateSchema, isObservation } from '@cs/protocol';
import type { AgentState, StoredEvent } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';

export const AGENT_STATE_CHANGED = 'agent_state_changed';

/** The `extras.reason` of a turn ended by `maxIterations`. */
export const MAX_ITERATIONS_REASON = 'max_iterations';
/** The `extras.reason` of a turn whose agent threw. */
export const AGENT_ERROR_REASON = 'agent_error';

export interface AgentStateChange {
  agentState: AgentState;
  reason?: string;
}

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

/** The state change an event records, or null when it is not one. */
export function readAgentStateChange(event: StoredEvent): AgentStateChange | null {
  if (!isObservation(event) || event.observation !== AGENT_STATE_CHANGED) return null;
  const parsed = AgentStateSchema.safeParse(event.extras['agent_state']);
  if (!parsed.success) return null;
  const reason = event.extras['reason'];
  return typeof reason === 'string'
    ? { agentState: parsed.data, reason }
    : { agentState: parsed.data };
}

/** States that do not settle a user event: it is still being worked on. */
export function isSettledState(state: AgentState): boolean {
  return state !== 'running' && state !== 'loading';
}
