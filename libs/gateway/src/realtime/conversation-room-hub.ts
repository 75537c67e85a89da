import { Injectable } from '@nestjs/common';
import type { ConversationBroadcaster } from '@cs/core';
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';

/** A local receiver of one conversation's live traffic: a socket or an SSE response. */
export interface ConversationSubscriber {
  offerEvents(events: readonly StoredEvent[]): void;
  sendStatus(status: StatusUpdate): void;
  sendStream(delta: StreamDelta): void;
  /** Live traffic may have been lost (a Redis reconnect): catch up from the store. */
  resync(): void;
}

/**
 * The conversations' rooms as seen by this process: which local subscribers
 * listen to which conversation. In the standalone process it is the
 * broadcaster itself; in a cluster gateway it is fed by the workers' emits
 * arriving through Redis.
 */
@Injectable()
export class ConversationRoomHub implements ConversationBroadcaster {
  private readonly rooms = new Map<string, Set<ConversationSubscriber>>();

  join(conversationId: string, subscriber: ConversationSubscriber): () => void {
    let room = this.rooms.get(conversationId);
    if (!room) {
      room = new Set();
      this.rooms.set(conversationId, room);
    }
    room.add(subscriber);
    return () => {
      room.delete(subscriber);
      if (room.size === 0 && this.rooms.get(conversationId) === room)
        this.rooms.delete(conversationId);
    };
  }

  /** Number of local subscribers (sockets and SSE streams). */
  get subscriberCount(): number {
    let count = 0;
    for (const room of this.rooms.values()) count += room.size;
    return count;
  }

  hasSubscribers(conversationId: string): boolean {
    return this.rooms.has(conversationId);
  }

  /** Every local subscriber catches up from the store. */
  resyncAll(): void {
    for (const room of this.rooms.values()) for (const subscriber of room) subscriber.resync();
  }

  publishEvents(conversationId: string, events: readonly StoredEvent[]): void {
    for (const subscriber of this.rooms.get(conversationId) ?? []) subscriber.offerEvents(events);
  }

  publishStatus(conversationId: string, status: StatusUpdate): void {
    for (const subscriber of this.rooms.get(conversationId) ?? []) subscriber.sendStatus(status);
  }

  publishStream(conversationId: string, delta: StreamDelta): void {
    for (const subscriber of this.rooms.get(conversationId) ?? []) subscriber.sendStream(delta);
  }
}
