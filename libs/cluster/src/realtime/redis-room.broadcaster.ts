import {
  endsStream,
  nextStreamText,
  type ConversationBroadcaster,
  type StreamText,
} from '@cs/core';
import type { RoomMessage, StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * Publishes a conversation's live traffic on its own Redis channel, which
 * only the gateways with a subscriber to that conversation listen to: an
 * event costs Redis one delivery per such gateway, and the other gateways
 * nothing, however many there are.
 */
/** How long a step's text so far stays in Redis after its last delta. */
export const STREAM_TEXT_TTL_MS = 60_000;
/** Rooms streaming at once whose text this process tracks; past it the oldest are dropped. */
const MAX_TRACKED_STREAMS = 10_000;

export class RedisRoomBroadcaster implements ConversationBroadcaster {
  /** The text each room's current step streamed so far, by room. */
  private readonly streams = new Map<string, StreamText>();

  /** @param publisher a connection for PUBLISH (see `openPublisher`) */
  constructor(
    private readonly publisher: Redis,
    private readonly keys: ClusterKeys,
  ) {}

  publishEvents(room: string, events: readonly StoredEvent[]): void {
    if (events.length === 0) return;
    this.publish(room, { type: 'events', events: [...events] });
    const stream = this.streams.get(room);
    if (stream && events.some((event) => endsStream(event, stream.cause))) {
      this.streams.delete(room);
      this.publisher.del(this.keys.roomStream(room)).catch(() => undefined);
    }
  }

  publishStatus(room: string, status: StatusUpdate): void {
    this.publish(room, { type: 'status', status });
  }

  /**
   * A delta to the room, and the step's text so far to Redis, in one
   * round trip (the publisher pipelines): a gateway that opens the room
   * later gives its clients that text first.
   */
  publishStream(room: string, delta: StreamDelta): void {
    const stream = nextStreamText(this.streams.get(room) ?? null, delta);
    this.streams.delete(room);
    if (stream) {
      this.streams.set(room, stream);
      if (this.streams.size > MAX_TRACKED_STREAMS) {
        this.streams.delete(this.streams.keys().next().value as string);
      }
      this.publisher
        .set(
          this.keys.roomStream(room),
          JSON.stringify({ cause: stream.cause, text: stream.content }),
          'PX',
          STREAM_TEXT_TTL_MS,
        )
        .catch(() => undefined);
    }
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
