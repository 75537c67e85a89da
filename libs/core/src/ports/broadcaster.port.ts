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
