import { RoomStreams, type ConversationBroadcaster, type StreamText } from '@cs/core';
import type { RoomMessage, StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { encodeStreamText } from './stream-text-snapshot.js';

/**
 * Publishes a conversation's live traffic on its own Redis channel, which
 * only the gateways with a subscriber to that conversation listen to: an
 * event costs Redis one delivery per such gateway, and the other gateways
 * nothing, however many there are.
 */
/** How long a step's text so far stays in Redis after its last delta. */
export const STREAM_TEXT_TTL_MS = 60_000;

export class RedisRoomBroadcaster implements ConversationBroadcaster {
  /** The text each room's current step streamed so far. */
  private readonly streams = new RoomStreams();
  /** When the Redis copy of each step's text last had its TTL set. */
  private readonly ttlSetAt = new WeakMap<StreamText, number>();

  /** @param publisher a connection for PUBLISH (see `openPublisher`) */
  constructor(
    private readonly publisher: Redis,
    private readonly keys: ClusterKeys,
  ) {}

  publishEvents(room: string, events: readonly StoredEvent[]): void {
    if (events.length === 0) return;
    this.publish(room, { type: 'events', events: [...events] });
    if (this.streams.endWith(room, events)) {
      this.publisher.del(this.keys.roomStream(room)).catch(() => undefined);
    }
  }

  publishStatus(room: string, status: StatusUpdate): void {
    this.publish(room, { type: 'status', status });
  }

  /**
   * A delta to the room, and the step's text so far kept in Redis (the
   * publisher pipelines both into one round trip): a gateway that opens the
   * room later gives its clients that text first. A delta that follows on is
   * appended there, so that a long answer costs no more per delta than a short
   * one; a delta after a gap makes the text unknown, and it is dropped.
   */
  publishStream(room: string, delta: StreamDelta): void {
    const tracked = this.streams.get(room);
    const knownLength = tracked?.cause === delta.cause ? tracked.content.length : -1;
    const stream = this.streams.apply(room, delta);
    const key = this.keys.roomStream(room);
    if (!stream) {
      if (tracked) this.publisher.del(key).catch(() => undefined);
    } else {
      const now = Date.now();
      if (delta.offset > 0 && delta.offset === knownLength) {
        this.publisher.append(key, delta.delta).catch(() => undefined);
        // APPEND keeps the TTL: it is set again only when half of it has passed.
        if (now - (this.ttlSetAt.get(stream) ?? 0) > STREAM_TEXT_TTL_MS / 2) {
          this.publisher.pexpire(key, STREAM_TEXT_TTL_MS).catch(() => undefined);
          this.ttlSetAt.set(stream, now);
        }
      } else {
        this.publisher
          .set(
            key,
            encodeStreamText({ cause: stream.cause, text: stream.content }),
            'PX',
            STREAM_TEXT_TTL_MS,
          )
          .catch(() => undefined);
        this.ttlSetAt.set(stream, now);
      }
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
