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
