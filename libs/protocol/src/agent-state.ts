import { z } from 'zod';
import { AGENT_STATES } from './agent-state-change.js';

// The states themselves are listed in agent-state-change.ts, which imports nothing.
export const AgentStateSchema = z.enum(AGENT_STATES);

/** States a client may ask for with `change_agent_state`. */
export const REQUESTABLE_AGENT_STATES = [
  'stopped',
  'paused',
  'running',
  'user_confirmed',
  'user_rejected',
] as const;

export const CONVERSATION_STATUSES = ['STOPPED', 'STARTING', 'RUNNING', 'ERROR'] as const;
export const ConversationStatusSchema = z.enum(CONVERSATION_STATUSES);
export type ConversationStatus = z.infer<typeof ConversationStatusSchema>;

/** Status ids sent as non-stored `status_update` messages. */
export const StatusId = {
  Ready: 'STATUS$READY',
  Starting: 'STATUS$STARTING',
  Stopped: 'STATUS$STOPPED',
  TooManyConversations: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
  AgentError: 'AGENT_ERROR$ERROR',
  /** The connection is closed next: its token expired (reconnect with a fresh one). */
  TokenExpired: 'STATUS$TOKEN_EXPIRED',
  /** The connection is closed next: its conversation was deleted. */
  ConversationDeleted: 'STATUS$CONVERSATION_DELETED',
  TitleUpdated: 'STATUS$TITLE_UPDATED',
  LlmRetry: 'STATUS$LLM_RETRY',
} as const;

/** Status updates after which the server closes the connection that received them. */
export const CLOSING_STATUS_IDS: ReadonlySet<string> = new Set([
  StatusId.TokenExpired,
  StatusId.ConversationDeleted,
]);
export type StatusId = (typeof StatusId)[keyof typeof StatusId];
