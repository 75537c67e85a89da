// @cs/client: the conversation service's SDK for browsers and Node 20+.
export { createClient, type ClientOptions, type ConversationServiceClient } from './client.js';
export { ConversationsApi, type FetchFunction } from './conversations-api.js';
export { ConversationServiceError } from './errors.js';
export {
  LiveConversation,
  newClientEventId,
  type ConnectionState,
  type DeltaUpdate,
  type LiveConversationListeners,
  type LiveConversationOptions,
  type UndoneUpdate,
} from './live-conversation.js';
export { StreamedText } from './streamed-text.js';
export type { TokenProvider } from './token-source.js';
export {
  agentStateOf,
  isActionEvent,
  isAgentMessage,
  isAgentState,
  isObservationEvent,
  isStatusUpdate,
  isStreamDelta,
} from './wire-guards.js';
export * from './wire.js';
// The text limits of the contract, from the very file of libs/protocol that defines them.
export {
  MAX_AGENT_MESSAGE_CHARS,
  MAX_MESSAGE_CONTENT_CHARS,
  MAX_TITLE_CHARS,
} from './protocol/limits.js';
