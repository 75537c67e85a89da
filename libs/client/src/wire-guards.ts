// Structural checks of what arrives from the server. Small on purpose (no
// schema library in the bundle): they decide what a message is and guard every
// field the SDK reads, so that an unexpected shape is passed through or
// ignored, never a crash. Unknown fields are kept as they came.
import { isAgentState, readAgentState } from './protocol/agent-state-change.js';
import {
  type ActionEvent,
  type AgentState,
  type ObservationEvent,
  type StatusUpdate,
  type StoredEvent,
  type StreamDelta,
  type UserActionAck,
} from './wire.js';

type Loose = Record<string, unknown>;

function isObject(value: unknown): value is Loose {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isIndex(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0;
}

/**
 * Anything with an integer `id` ≥ 0 is a stored event: its id orders the
 * conversation, whatever the rest of it looks like.
 */
export function hasEventId(value: unknown): value is StoredEvent {
  return isObject(value) && isIndex(value.id);
}

function hasEnvelope(value: Loose): boolean {
  return (
    isIndex(value.id) &&
    typeof value.timestamp === 'string' &&
    typeof value.source === 'string' &&
    (value.cause === undefined || isIndex(value.cause))
  );
}

export function isActionEvent(value: unknown): value is ActionEvent {
  return (
    isObject(value) &&
    hasEnvelope(value) &&
    typeof value.action === 'string' &&
    isObject(value.args) &&
    (value.client_event_id === undefined || typeof value.client_event_id === 'string')
  );
}

export function isObservationEvent(value: unknown): value is ObservationEvent {
  return (
    isObject(value) &&
    hasEnvelope(value) &&
    typeof value.observation === 'string' &&
    typeof value.content === 'string' &&
    isObject(value.extras)
  );
}

export function isStatusUpdate(value: unknown): value is StatusUpdate {
  return isObject(value) && value.status_update === true && typeof value.id === 'string';
}

/** A delta; `offset` may be missing from an older server (then: appended). */
export function isStreamDelta(value: unknown): value is StreamDelta {
  return (
    isObject(value) &&
    value.stream === true &&
    isIndex(value.cause) &&
    typeof value.delta === 'string' &&
    (value.offset === undefined || isIndex(value.offset))
  );
}

export { isAgentState };

/**
 * The agent state an `agent_state_changed` observation sets, if it is one: a
 * well-formed observation, read by the protocol's own reader.
 */
export function agentStateOf(event: StoredEvent): AgentState | undefined {
  if (!isObservationEvent(event)) return undefined;
  return readAgentState(event) ?? undefined;
}

/** An agent's stored answer to the user event `cause` (complete or interrupted). */
export function isAgentMessage(
  event: unknown,
): event is ActionEvent & { cause: number; args: { content: string } } {
  return (
    isActionEvent(event) &&
    event.source === 'agent' &&
    event.action === 'message' &&
    event.cause !== undefined &&
    typeof event.args.content === 'string'
  );
}

export function isUserActionAck(value: unknown): value is UserActionAck {
  if (!isObject(value)) return false;
  if (value.ok === true) return isIndex(value.event_id);
  return (
    value.ok === false &&
    isObject(value.error) &&
    typeof value.error.code === 'string' &&
    typeof value.error.message === 'string'
  );
}

/** `{ error: { code, message, field? } }`, the body of every REST error. */
export function errorDetailOf(
  body: unknown,
): { code: string; message: string; field?: string } | undefined {
  if (!isObject(body) || !isObject(body.error)) return undefined;
  const { code, message, field } = body.error;
  if (typeof code !== 'string') return undefined;
  return {
    code,
    message: typeof message === 'string' ? message : code,
    ...(typeof field === 'string' ? { field } : {}),
  };
}
