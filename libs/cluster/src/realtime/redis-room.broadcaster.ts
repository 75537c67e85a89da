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

  publishEvents(room: string, events: readonly StoredEvent[]): void {
    if (events.length > 0) this.publish(room, { type: 'events', events: [...events] });
  }

  publishStatus(room: string, status: StatusUpdate): void {
    this.publish(room, { type: 'status', status });
  }

  publishStream(room: string, delta: StreamDelta): void {
    this.publish(room, { type: 'stream', delta });
  }

  private publish(room: string, message: RoomMessage): void {
    // Live traffic is a hint on top of Postgres: subscribers that miss it
    // catch up from the store, so a failed publish is not the caller's error.
    this.publisher
      .publish(this.keys.conversationRoom(room), JSON.stringify(message))
      .catch(() => undefined);
  }
}
