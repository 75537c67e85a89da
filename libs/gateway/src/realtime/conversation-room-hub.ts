import { Inject, Injectable, Optional } from '@nestjs/common';
import { RoomStreams, type RoomSink } from '@cs/core';
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import { ROOM_TRAFFIC_SOURCE } from '../tokens.js';

/** A local receiver of one conversation's live traffic: a socket or an SSE response. */
export interface ConversationSubscriber {
  offerEvents(events: readonly StoredEvent[]): void;
  sendStatus(status: StatusUpdate): void;
  sendStream(delta: StreamDelta): void;
  /** Live traffic may have been lost (a Redis reconnect): catch up from the store. */
  resync(): void;
}

/**
 * Where a cluster gateway's rooms get their live traffic (Redis, a channel per
 * conversation): a room is opened when its first local subscriber joins and
 * closed when its last one leaves. The standalone process has none: its
 * sessions publish to the hub directly.
 */
export interface RoomTrafficSource {
  /**
   * Starts delivering the conversation's traffic to `sink`; resolves once it
   * flows. A step streaming then reaches the sink as `catchUpStream`.
   */
  open(room: string, sink: RoomSink): Promise<void>;
  close(room: string): void;
}

/** A subscriber's place in a room: `ready` once live traffic reaches it. */
export interface RoomMembership {
  ready: Promise<void>;
  leave: () => void;
}

interface Room {
  subscribers: Set<ConversationSubscriber>;
  ready: Promise<void>;
}

/**
 * The conversations' rooms as seen by this process: which local subscribers
 * listen to which conversation. In the standalone process it is the
 * broadcaster itself; in a cluster gateway it is fed by its traffic source
 * with the traffic of the rooms it has subscribers in.
 */
@Injectable()
export class ConversationRoomHub implements RoomSink {
  private readonly rooms = new Map<string, Room>();
  /**
   * The text each room's current step has streamed so far, for late joiners.
   * Standalone, the hub is the broadcaster: it keeps every room's, with
   * subscribers or not (the first client to join mid-step needs it). A
   * cluster gateway keeps those of its open rooms only: a room opened
   * mid-step gets its text so far from the conversation's holder
   * (`catchUpStream`), and until then the deltas it cannot place are not
   * passed on (the catch-up holds them).
   */
  private readonly streams = new RoomStreams();

  constructor(
    @Optional()
    @Inject(ROOM_TRAFFIC_SOURCE)
    private readonly source: RoomTrafficSource | null = null,
  ) {}

  /**
   * Adds a subscriber. Live traffic reaches it once `ready` has resolved: a
   * feed replays from the store only after that, so that nothing stored in
   * between is missed.
   */
  join(room: string, subscriber: ConversationSubscriber): RoomMembership {
    let joined = this.rooms.get(room);
    if (!joined) {
      const ready = this.source?.open(room, this) ?? Promise.resolve();
      ready.catch(() => undefined); // each member awaits it and handles a failure
      joined = { subscribers: new Set(), ready };
      this.rooms.set(room, joined);
    }
    const member = joined;
    member.subscribers.add(subscriber);
    return {
      ready: member.ready,
      leave: () => {
        member.subscribers.delete(subscriber);
        if (member.subscribers.size > 0 || this.rooms.get(room) !== member) return;
        this.rooms.delete(room);
        if (this.source) {
          this.streams.delete(room);
          this.source.close(room);
        }
      },
    };
  }

  /** Number of local subscribers (sockets and SSE streams). */
  get subscriberCount(): number {
    let count = 0;
    for (const room of this.rooms.values()) count += room.subscribers.size;
    return count;
  }

  hasSubscribers(room: string): boolean {
    return this.rooms.has(room);
  }

  /** Every local subscriber catches up from the store. */
  resyncAll(): void {
    for (const room of this.rooms.values())
      for (const subscriber of room.subscribers) subscriber.resync();
  }

  publishEvents(room: string, events: readonly StoredEvent[]): void {
    // The step's stored message ends its stream: late joiners replay the message.
    this.streams.endWith(room, events);
    for (const subscriber of this.members(room)) subscriber.offerEvents(events);
  }

  /**
   * The text streamed so far by the step running in the room, as one delta
   * from offset 0 (the catch-up a late joiner gets), or null.
   */
  streamOf(room: string): StreamDelta | null {
    const stream = this.streams.get(room);
    if (!stream || stream.content === '') return null;
    return { stream: true, cause: stream.cause, delta: stream.content, offset: 0 };
  }

  publishStatus(room: string, status: StatusUpdate): void {
    for (const subscriber of this.members(room)) subscriber.sendStatus(status);
  }

  publishStream(room: string, delta: StreamDelta): void {
    if (this.source === null) {
      this.streams.apply(room, delta);
    } else if (!this.rooms.has(room) || !this.streams.apply(room, delta)) {
      // A delta after a gap: no client could place it. The step's stored
      // message, or a catch-up, brings the text.
      return;
    }
    for (const subscriber of this.members(room)) subscriber.sendStream(delta);
  }

  /**
   * The text so far of the step streaming when this gateway opened the room
   * (or lost deltas), from the conversation's holder: taken unless this
   * gateway knows that step's text already (every gateway of the room gets
   * it), and passed on as the catch-up of the room's subscribers.
   */
  catchUpStream(room: string, delta: StreamDelta): void {
    if (delta.offset !== 0 || !this.rooms.has(room)) return;
    if (this.streams.get(room)?.cause === delta.cause) return;
    this.streams.apply(room, delta);
    for (const subscriber of this.members(room)) subscriber.sendStream(delta);
  }

  /** A copy: a subscriber may leave while it is being sent to. */
  private members(room: string): Iterable<ConversationSubscriber> {
    const joined = this.rooms.get(room);
    return joined ? [...joined.subscribers] : [];
  }
}
