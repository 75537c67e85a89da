// The wire types of docs/protocol.md, as the SDK publishes them. They mirror the zod
// schemas of libs/protocol without importing zod (the SDK stays small and its
// declarations self-contained); wire.spec.ts checks, at compile time and at
// run time, that whatever those schemas accept fits these types and guards.

import type { AgentState } from './protocol/agent-state-change.js';

// The agent states, from the very file of libs/protocol that reads them (no imports, no zod).
export { AGENT_STATES, type AgentState } from './protocol/agent-state-change.js';

/** The states a client may ask for with `setAgentState`. */
export type RequestableAgentState =
  'stopped' | 'paused' | 'running' | 'user_confirmed' | 'user_rejected';

export type ConversationStatus = 'STOPPED' | 'STARTING' | 'RUNNING' | 'ERROR';
export type MultitaskStrategy = 'enqueue' | 'interrupt' | 'reject';
export type EventSource = 'user' | 'agent' | 'environment';

/** The error codes of the contract (`string` leaves room for codes added later). */
export type ErrorCode =
  | 'BAD_REQUEST'
  | 'UNAUTHORIZED'
  | 'NOT_FOUND'
  | 'CONFLICT'
  | 'AGENT_BUSY'
  | 'PAYLOAD_TOO_LARGE'
  | 'RATE_LIMITED'
  | 'CONCURRENCY_LIMIT_REACHED'
  | 'UNAVAILABLE'
  | (string & {});

interface EventEnvelope {
  /** The event's place in its conversation: 0, 1, 2, … */
  id: number;
  timestamp: string;
  source: EventSource;
  /** The id of the event this one answers (an agent's message: the user message). */
  cause?: number;
  /** Set on events read back after a rewind undid them: the rewind event's id. */
  undone_by?: number;
}

export interface ActionEvent extends EventEnvelope {
  action: string;
  args: Record<string, unknown>;
  message: string;
  client_event_id?: string;
}

export interface ObservationEvent extends EventEnvelope {
  observation: string;
  content: string;
  extras: Record<string, unknown>;
  message: string;
}

/** A stored event: always has an integer `id`. */
export type StoredEvent = ActionEvent | ObservationEvent;

/** Not stored, no `id`: `STATUS$READY`, `AGENT_ERROR$TOO_MANY_CONVERSATIONS`, … */
export interface StatusUpdate {
  status_update: true;
  type: 'info' | 'error';
  id: string;
  message: string;
}

/** Token streaming, not stored: `offset` is the length of the step's text before `delta`. */
export interface StreamDelta {
  stream: true;
  cause: number;
  delta: string;
  offset: number;
}

/** Everything the server sends as `oh_event`. */
export type ServerEvent = StoredEvent | StatusUpdate | StreamDelta;

/** The acknowledgement of `oh_user_action`. */
export type UserActionAck =
  | { ok: true; event_id: number }
  | { ok: false; error: { code: string; message: string; field?: string } };

export interface ConversationInfo {
  conversation_id: string;
  title: string;
  created_at: string;
  last_updated_at: string;
  status: ConversationStatus;
  agent_state: AgentState | null;
  metadata: Record<string, unknown>;
  last_event_id: number;
  agent?: string;
  confirmation_mode?: boolean;
  multitask_strategy?: MultitaskStrategy;
  /** The conversation a fork was made of, and the last event it copied; null unless forked. */
  parent_conversation_id?: string | null;
  forked_from_event_id?: number | null;
}

/** `POST /conversations/:id/fork`. */
export interface ForkBody {
  /** Default: the source's last event. */
  at_event_id?: number;
  title?: string;
  metadata?: Record<string, unknown>;
}

/** Options of the branching calls: an `Idempotency-Key` (a repeat gives the first result). */
export interface BranchOptions {
  idempotencyKey?: string;
}

export interface CreateConversationBody {
  initial_user_msg?: string;
  title?: string;
  agent?: string;
  agent_config?: Record<string, unknown>;
  confirmation_mode?: boolean;
  multitask_strategy?: MultitaskStrategy;
  max_iterations?: number;
  max_budget_usd?: number;
  metadata?: Record<string, unknown>;
  conversation_instructions?: string;
  /** A JSON array of event bodies to store as the conversation's history. */
  replay_json?: string;
  conversation_id?: string;
}

export interface CreateConversationResponse {
  conversation_id: string;
  conversation_status: ConversationStatus;
}

export interface PatchConversationBody {
  title?: string;
  metadata?: Record<string, unknown>;
  confirmation_mode?: boolean;
  multitask_strategy?: MultitaskStrategy;
}

export interface ListConversationsOptions {
  /** Conversations per page (1..100); the iterator walks every page. */
  limit?: number;
  /** An admin's view of the whole tenant. */
  all?: boolean;
}

export interface EventsQuery {
  start_id?: number;
  end_id?: number;
  reverse?: boolean;
  limit?: number;
}

export interface EventPage {
  events: StoredEvent[];
  has_more: boolean;
}

export interface ConversationMetrics {
  iterations: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
}

export interface ConversationState {
  agent_state: AgentState | null;
  state: Record<string, unknown>;
  metrics: ConversationMetrics;
  last_event_id: number;
  runtime?: { worker_id: string; lease_epoch: number };
}

/**
 * One line of a conversation's export (`conversations.export`), tagged: the
 * conversation first, then each event in id order, then its state. The
 * events, as `replay_json` of a new conversation, give it the same history.
 */
export type ConversationExportLine =
  | { kind: 'conversation'; conversation: ConversationInfo }
  | { kind: 'event'; event: StoredEvent }
  | { kind: 'state'; state: Record<string, unknown> };

/** The body of `oh_user_action`. */
export type UserActionPayload =
  | {
      action: 'message';
      args: { content: string; image_urls?: string[]; file_urls?: string[]; timestamp?: string };
      client_event_id?: string;
    }
  | {
      action: 'change_agent_state';
      args: { agent_state: RequestableAgentState };
      client_event_id?: string;
    };
