/**
 * The agent states, and how an `agent_state_changed` observation is read:
 * `{ observation: "agent_state_changed", extras: { agent_state, reason? } }`
 * (docs/protocol.md). Every reader of that observation (the domain, both stores,
 * the streams, the client SDK) goes through `readAgentState` here, so that
 * they all agree on what a state change is and which states settle a turn.
 *
 * Plain TypeScript that imports nothing, on purpose: the client SDK compiles
 * this very file into its package (libs/client/src/protocol/agent-state-change.ts
 * is a symlink to it), where zod and the rest of libs/protocol do not go.
 */

export const AGENT_STATE_CHANGED = 'agent_state_changed';

export const AGENT_STATES = [
  'loading',
  'running',
  'awaiting_user_input',
  'paused',
  'stopped',
  'finished',
  'rejected',
  'error',
  'awaiting_user_confirmation',
  'user_confirmed',
  'user_rejected',
  'rate_limited',
] as const;
export type AgentState = (typeof AGENT_STATES)[number];

export function isAgentState(value: unknown): value is AgentState {
  return typeof value === 'string' && (AGENT_STATES as readonly string[]).includes(value);
}

export interface AgentStateChange {
  agentState: AgentState;
  reason?: string;
}

/**
 * The agent state an `agent_state_changed` observation sets; null for any
 * other event, and for one that names no known state. Takes a stored event or
 * an event body (anything else is not an observation, hence null).
 */
export function readAgentState(event: object): AgentState | null {
  if (!('observation' in event) || event.observation !== AGENT_STATE_CHANGED) return null;
  const extras = 'extras' in event ? event.extras : undefined;
  if (typeof extras !== 'object' || extras === null || !('agent_state' in extras)) return null;
  return isAgentState(extras.agent_state) ? extras.agent_state : null;
}

/** `readAgentState` with the change's `extras.reason`, when it has one. */
export function readAgentStateChange(event: object): AgentStateChange | null {
  const agentState = readAgentState(event);
  if (agentState === null) return null;
  // readAgentState found `extras` to be an object.
  const { reason } = (event as { extras: { reason?: unknown } }).extras;
  return typeof reason === 'string' ? { agentState, reason } : { agentState };
}

/**
 * Whether a state settles the user event that caused it: anything but
 * `running` and `loading`, which say it is still being worked on.
 */
export function isSettledState(state: AgentState): boolean {
  return state !== 'running' && state !== 'loading';
}
