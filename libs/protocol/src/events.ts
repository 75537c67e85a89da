import { z } from 'zod';
import { AgentStateSchema, REQUESTABLE_AGENT_STATES } from './agent-state.js';
import {
  MAX_CLIENT_EVENT_ID_CHARS,
  MAX_MESSAGE_CONTENT_CHARS,
  MAX_URL_CHARS,
  MAX_URLS_PER_MESSAGE,
} from './limits.js';

/**
 * Events as they travel on the wire (`oh_event`) and as they are stored.
 * The shapes follow the OpenHands server: an event is either an action
 * (`action` + `args`) or an observation (`observation` + `content` + `extras`).
 */
export const EventSourceSchema = z.enum(['user', 'agent', 'environment']);
export type EventSource = z.infer<typeof EventSourceSchema>;

const JsonObjectSchema = z.record(z.string(), z.unknown());
export type JsonObject = Record<string, unknown>;

export const ActionBodySchema = z.object({
  action: z.string().min(1).max(128),
  args: JsonObjectSchema,
  message: z.string(),
});
export type ActionBody = z.infer<typeof ActionBodySchema>;

export const ObservationBodySchema = z.object({
  observation: z.string().min(1).max(128),
  content: z.string(),
  extras: JsonObjectSchema,
  message: z.string(),
});
export type ObservationBody = z.infer<typeof ObservationBodySchema>;

/** What an event says, without its envelope (id, timestamp, source, cause). */
export type EventBody = ActionBody | ObservationBody;
export const EventBodySchema = z.union([ActionBodySchema, ObservationBodySchema]);

const EnvelopeSchema = z.object({
  id: z.number().int().min(0),
  timestamp: z.string(),
  source: EventSourceSchema,
  cause: z.number().int().min(0).optional(),
  /** Set when read: the id of the rewind event that undid this one (see `branching.ts`). */
  undone_by: z.number().int().min(0).optional(),
});

export const ActionEventSchema = EnvelopeSchema.extend(ActionBodySchema.shape).extend({
  client_event_id: z.string().optional(),
});
export const ObservationEventSchema = EnvelopeSchema.extend(ObservationBodySchema.shape);
export type ActionEvent = z.infer<typeof ActionEventSchema>;
export type ObservationEvent = z.infer<typeof ObservationEventSchema>;

/** A stored event: always has an integer `id`, its place in the conversation. */
export type StoredEvent = ActionEvent | ObservationEvent;
export const StoredEventSchema = z.union([ActionEventSchema, ObservationEventSchema]);

export function isAction(body: EventBody): body is ActionBody {
  return 'action' in body;
}

export function isObservation(body: EventBody): body is ObservationBody {
  return 'observation' in body;
}

/** The name of an event's action or observation (the `type` column). */
export function eventType(body: EventBody): string {
  return isAction(body) ? body.action : body.observation;
}

export const AgentStateChangedExtrasSchema = z.object({
  agent_state: AgentStateSchema,
  reason: z.string().optional(),
});

/** A status update: sent live, never stored, has no `id`. */
export const StatusUpdateSchema = z.object({
  status_update: z.literal(true),
  type: z.enum(['info', 'error']),
  id: z.string(),
  message: z.string(),
});
export type StatusUpdate = z.infer<typeof StatusUpdateSchema>;

/** A token-streaming delta: sent live, never stored. */
export const StreamDeltaSchema = z.object({
  stream: z.literal(true),
  cause: z.number().int().min(0),
  delta: z.string(),
  /** UTF-16 code units of the step's text before `delta`; 0 starts it afresh. */
  offset: z.number().int().min(0),
});
export type StreamDelta = z.infer<typeof StreamDeltaSchema>;

/** Everything the server sends as `oh_event`. */
export type ServerEvent = StoredEvent | StatusUpdate | StreamDelta;

// ---------------------------------------------------------------- user actions

export const ClientEventIdSchema = z.string().min(1).max(MAX_CLIENT_EVENT_ID_CHARS);

const UrlListSchema = z.array(z.string().max(MAX_URL_CHARS)).max(MAX_URLS_PER_MESSAGE);

export const MessageArgsSchema = z.strictObject({
  content: z.string().max(MAX_MESSAGE_CONTENT_CHARS),
  image_urls: UrlListSchema.default([]),
  file_urls: UrlListSchema.default([]),
  timestamp: z.string().max(64).optional(),
});

export const UserMessageActionSchema = z.strictObject({
  action: z.literal('message'),
  args: MessageArgsSchema,
  client_event_id: ClientEventIdSchema.optional(),
});

export const ChangeAgentStateActionSchema = z.strictObject({
  action: z.literal('change_agent_state'),
  args: z.strictObject({ agent_state: z.enum(REQUESTABLE_AGENT_STATES) }),
  client_event_id: ClientEventIdSchema.optional(),
});

/** The body of `oh_user_action` and of `POST /api/conversations/:id/events`. */
export const UserActionSchema = z.discriminatedUnion('action', [
  UserMessageActionSchema,
  ChangeAgentStateActionSchema,
]);
export type UserAction = z.infer<typeof UserActionSchema>;
export type UserMessageAction = z.infer<typeof UserMessageActionSchema>;
export type ChangeAgentStateAction = z.infer<typeof ChangeAgentStateActionSchema>;

/** The acknowledgement of `oh_user_action`. */
export type UserActionAck =
  | { ok: true; event_id: number }
  | { ok: false; error: { code: string; message: string; field?: string } };
