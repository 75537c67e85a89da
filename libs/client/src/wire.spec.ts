// The SDK's wire types and guards against libs/protocol's zod schemas: the
// types at compile time (root `tsc`), the guards at run time on samples.
import { describe, expect, it } from 'vitest';
import type { z } from 'zod';
import {
  AGENT_STATES as PROTOCOL_AGENT_STATES,
  ActionEventSchema,
  ObservationEventSchema,
  StatusUpdateSchema,
  StoredEventSchema,
  type UserActionSchema,
  type ActionEvent as ProtocolActionEvent,
  type AgentState as ProtocolAgentState,
  type ConversationInfo as ProtocolConversationInfo,
  type ConversationStateResponse as ProtocolConversationState,
  type ConversationStatus as ProtocolConversationStatus,
  type ObservationEvent as ProtocolObservationEvent,
  type StatusUpdate as ProtocolStatusUpdate,
  type StoredEvent as ProtocolStoredEvent,
  type UserActionAck as ProtocolUserActionAck,
} from '@cs/protocol';
import {
  agentStateOf,
  hasEventId,
  isActionEvent,
  isAgentMessage,
  isObservationEvent,
  isStatusUpdate,
  isStreamDelta,
  isUserActionAck,
} from './wire-guards.js';
import {
  AGENT_STATES,
  type ActionEvent,
  type AgentState,
  type ConversationInfo,
  type ConversationState,
  type ConversationStatus,
  type ObservationEvent,
  type StatusUpdate,
  type StoredEvent,
  type UserActionAck,
  type UserActionPayload,
} from './wire.js';

/** Compiles only when everything of type `From` is also a `To`. */
type Fits<From, To> = [From] extends [To] ? true : false;
const conformance: Array<true> = [
  true satisfies Fits<ProtocolActionEvent, ActionEvent>,
  true satisfies Fits<ProtocolObservationEvent, ObservationEvent>,
  true satisfies Fits<ProtocolStoredEvent, StoredEvent>,
  true satisfies Fits<ProtocolStatusUpdate, StatusUpdate>,
  true satisfies Fits<ProtocolUserActionAck, UserActionAck>,
  true satisfies Fits<ProtocolConversationInfo, ConversationInfo>,
  true satisfies Fits<ProtocolConversationState, ConversationState>,
  true satisfies Fits<ProtocolAgentState, AgentState>,
  true satisfies Fits<AgentState, ProtocolAgentState>,
  true satisfies Fits<ProtocolConversationStatus, ConversationStatus>,
  true satisfies Fits<ConversationStatus, ProtocolConversationStatus>,
  // What the SDK sends is a user action the server accepts.
  true satisfies Fits<
    Extract<UserActionPayload, { action: 'message' }>,
    z.input<typeof UserActionSchema>
  >,
];

const action = {
  id: 3,
  timestamp: '2026-12-01T00:00:00.000Z',
  source: 'agent',
  cause: 2,
  action: 'message',
  args: { content: 'echo: hi' },
  message: '',
};
const observation = {
  id: 4,
  timestamp: '2026-12-01T00:00:00.000Z',
  source: 'environment',
  observation: 'agent_state_changed',
  content: '',
  extras: { agent_state: 'awaiting_user_input' },
  message: '',
};

describe('wire types and guards', () => {
  it('hold for the protocol (types checked at compile time)', () => {
    expect(conformance.every(Boolean)).toBe(true);
    expect([...AGENT_STATES]).toEqual([...PROTOCOL_AGENT_STATES]);
  });

  it('accept what the protocol schemas accept', () => {
    expect(ActionEventSchema.safeParse(action).success).toBe(true);
    expect(isActionEvent(action)).toBe(true);
    expect(ObservationEventSchema.safeParse(observation).success).toBe(true);
    expect(isObservationEvent(observation)).toBe(true);
    const status = { status_update: true, type: 'info', id: 'STATUS$READY', message: 'ready' };
    expect(StatusUpdateSchema.safeParse(status).success).toBe(true);
    expect(isStatusUpdate(status)).toBe(true);
  });

  it('refuse what the protocol schemas refuse, for the fields the SDK reads', () => {
    const broken = [
      { ...action, id: -1 },
      { ...action, id: 1.5 },
      { ...action, args: 'content' },
      { ...action, cause: 'two' },
      { ...observation, extras: null },
      { ...observation, content: 7 },
    ];
    for (const sample of broken) {
      expect(StoredEventSchema.safeParse(sample).success).toBe(false);
      expect(isActionEvent(sample) || isObservationEvent(sample)).toBe(false);
    }
  });

  it('pass unknown fields through unchanged', () => {
    const extended = { ...action, extra: { nested: true } };
    expect(isActionEvent(extended)).toBe(true);
    expect(hasEventId(extended)).toBe(true);
    expect(extended.extra).toEqual({ nested: true });
  });

  it('read the agent state and the agent message only from well-formed events', () => {
    expect(agentStateOf(observation as StoredEvent)).toBe('awaiting_user_input');
    expect(
      agentStateOf({ ...observation, extras: { agent_state: 'dancing' } } as StoredEvent),
    ).toBeUndefined();
    expect(isAgentMessage(action)).toBe(true);
    expect(isAgentMessage({ ...action, args: { content: 42 } })).toBe(false);
    expect(isAgentMessage({ ...action, source: 'user' })).toBe(false);
  });

  it('tell deltas and acknowledgements from other shapes, never throwing', () => {
    expect(isStreamDelta({ stream: true, cause: 1, delta: 'a', offset: 0 })).toBe(true);
    expect(isStreamDelta({ stream: true, cause: 1, delta: 'a', offset: -1 })).toBe(false);
    expect(isUserActionAck({ ok: true, event_id: 3 })).toBe(true);
    expect(isUserActionAck({ ok: false, error: { code: 'CONFLICT', message: 'x' } })).toBe(true);
    expect(isUserActionAck({ ok: false })).toBe(false);
    for (const odd of [null, undefined, 'text', 42, [], { id: 'x' }]) {
      expect(hasEventId(odd) || isStatusUpdate(odd) || isStreamDelta(odd)).toBe(false);
    }
  });
});
