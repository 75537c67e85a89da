import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';

/**
 * Fan-out to a conversation's room, named by `roomKey` (an id and its
 * incarnation): in one process the local room hub, in the cluster the
 * conversation's Redis channel. Delivery is best effort; clients fill gaps
 * from the store, so a lost emit costs latency, never an event.
 */
export interface ConversationBroadcaster {
  publishEvents(room: string, events: readonly StoredEvent[]): void;
  publishStatus(room: string, status: StatusUpdate): void;
  publishStream(room: string, delta: StreamDelta): void;
}

/**
 * What receives a room's live traffic in a cluster gateway: what the
 * broadcaster publishes, and the catch-up of a step that was streaming when
 * the gateway opened the room (its text so far, one delta from offset 0,
 * sent by the conversation's holder on the gateway's request).
 */
export interface RoomSink extends ConversationBroadcaster {
  catchUpStream(room: string, delta: StreamDelta): void;
}
