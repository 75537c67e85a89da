import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';

/**
 * Fan-out to a conversation's room: in one process a Socket.IO server, in the
 * cluster the Redis emitter. Delivery is best effort; clients fill gaps from
 * the store, so a lost emit costs latency, never an event.
 */
export interface ConversationBroadcaster {
  publishEvents(conversationId: string, events: readonly StoredEvent[]): void;
  publishStatus(conversationId: string, status: StatusUpdate): void;
  publishStream(conversationId: string, delta: StreamDelta): void;
}
