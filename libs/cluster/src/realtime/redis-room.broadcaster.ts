import type { ConversationBroadcaster } from '@cs/core';
import type { RoomMessage, StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * Publishes a conversation's live traffic on its own Redis channel, which
 * only the gateways with a subscriber to that conversation listen to: an
 * event costs Redis one delivery per such gateway, and the other gateways
 * nothing, however many there are.
 */
export class RedisRoomBroadcaster implements ConversationBroadcaster {
  /** @param publisher a connection for PUBLISH (see `openPublisher`) */
  constructor(
    private readonly publisher: Redis,
    private readonly keys: ClusterKeys,
  ) {}

  publishEvents(conversationId: string, events: readonly StoredEvent[]): void {
    if (events.length > 0) this.publish(conversationId, { type: 'events', events: [...events] });
  }

  publishStatus(conversationId: string, status: StatusUpdate): void {
    this.publish(conversationId, { type: 'status', status });
  }

  publishStream(conversationId: string, delta: StreamDelta): void {
    this.publish(conversationId, { type: 'stream', delta });
  }

  private publish(conversationId: string, message: RoomMessage): void {
    // Live traffic is a hint on top of Postgres: subscribers that miss it
    // catch up from the store, so a failed publish is not the caller's error.
    this.publisher
      .publish(this.keys.conversationRoom(conversationId), JSON.stringify(message))
      .catch(() => undefined);
  }
}
