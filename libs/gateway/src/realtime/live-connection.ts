/**
 * One client's live view of one conversation, whatever carries it (a socket
 * or an SSE response): the gap-free feed, its place in the room, and the
 * rules that end it: its token's expiry, the conversation's deletion, and a
 * client that stops reading.
 */
import { refOf, roomKey, type ConversationRecord } from '@cs/core';
import {
  CLOSING_STATUS_IDS,
  StatusId,
  type ServerEvent,
  type StatusUpdate,
  type StoredEvent,
  type StreamDelta,
} from '@cs/protocol';
import type { Principal } from '../auth/principal.js';
import type { ConversationRoomHub, ConversationSubscriber } from './conversation-room-hub.js';
import { OrderedEventFeed, type EventPageReader } from './ordered-event-feed.js';

/** docs/protocol.md: a connection with this much unsent for it is closed. */
export const MAX_UNSENT_BYTES = 8 * 1024 * 1024;
/** A replay reads its next page only once less than this waits for the client. */
export const REPLAY_LOW_WATER_BYTES = 1024 * 1024;
/** setTimeout's longest delay; later expiries are waited for in steps. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** What carries a live connection to its client. */
export interface ConnectionTransport {
  send(message: ServerEvent): void;
  /** Bytes written for the client that it has not taken yet. */
  unsentBytes(): number;
  /** Resolves once less than `REPLAY_LOW_WATER_BYTES` waits (or the connection ended). */
  drained(): Promise<void>;
  /**
   * Ends the connection from the server's side: after what was sent when
   * `graceful` (the client should read why), at once otherwise.
   */
  close(graceful: boolean): void;
}

/** The ids of docs/protocol.md "Operations" for log lines about a connection's conversation. */
export function logFieldsOf(conversation: ConversationRecord): Record<string, string> {
  return {
    conversation_id: conversation.id,
    tenant_id: conversation.tenantId,
    user_id: conversation.userId,
  };
}

/** Resolves at the first of `events` on `emitter` (a drain, or the connection's close). */
export function firstOf(
  emitter: {
    on(event: string, listener: () => void): unknown;
    off(event: string, listener: () => void): unknown;
  },
  events: readonly string[],
): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      for (const event of events) emitter.off(event, done);
      resolve();
    };
    for (const event of events) emitter.on(event, done);
  });
}

export interface LiveConnectionOptions {
  hub: ConversationRoomHub;
  conversation: ConversationRecord;
  principal: Principal;
  /** The last event id the client has. */
  afterId: number;
  read: EventPageReader;
  transport: ConnectionTransport;
  /**
   * Whether the room's deletion notice ends this connection (default: yes,
   * an SSE stream's). A socket hears it and is closed through the Socket.IO
   * adapter instead (`ConversationSockets.closeDeleted`), so it ignores the
   * room's copy: the client reads it once.
   */
  endsOnDeletion?: boolean;
  /** Why the connection was ended by the server (logged by the caller). */
  onEnd?: (why: 'expired' | 'deleted' | 'overflow' | 'closed') => void;
  onError?: (error: unknown) => void;
  /** The clock of expiries (tests). */
  now?: () => number;
}

export class LiveConnection implements ConversationSubscriber {
  private readonly feed: OrderedEventFeed;
  private leave: (() => void) | null = null;
  private expiry: NodeJS.Timeout | undefined;
  private ended = false;
  private room = '';
  /** Past the replay: live deltas go out (before it, the catch-up covers them). */
  private live = false;
  /** The streamed text this client has: which turn, how many characters. */
  private streamed: { cause: number; length: number } | null = null;

  constructor(private readonly options: LiveConnectionOptions) {
    this.feed = new OrderedEventFeed({
      afterId: options.afterId,
      read: options.read,
      send: (event) => this.send(event),
      beforePage: () => options.transport.drained(),
      onError: options.onError,
    });
  }

  /** Joins the room, then replays what the client missed; live traffic follows. */
  async start(): Promise<void> {
    if (this.ended) return;
    this.scheduleExpiry();
    this.room = roomKey(refOf(this.options.conversation));
    const membership = this.options.hub.join(this.room, this);
    this.leave = membership.leave;
    await membership.ready;
    if (this.ended) return;
    await this.feed.start();
    // A step streaming now: the text so far in one delta, then the rest live.
    this.live = true;
    const catchUp = this.options.hub.streamOf(this.room);
    if (catchUp) this.sendStream(catchUp);
  }

  /** The client left: forget it (idempotent). */
  dispose(): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.expiry);
    this.feed.close();
    this.leave?.();
    this.leave = null;
  }

  get lastDeliveredId(): number {
    return this.feed.lastDeliveredId;
  }

  // ------------------------------------------------- ConversationSubscriber

  offerEvents(events: readonly StoredEvent[]): void {
    this.feed.offer(events);
    this.checkBacklog();
  }

  sendStatus(status: StatusUpdate): void {
    if (status.id === StatusId.ConversationDeleted && this.options.endsOnDeletion === false) return;
    this.send(status);
    if (CLOSING_STATUS_IDS.has(status.id)) {
      this.end(status.id === StatusId.TokenExpired ? 'expired' : 'deleted');
    }
  }

  sendStream(delta: StreamDelta): void {
    if (!this.live) return;
    const end = delta.offset + delta.delta.length;
    const known = this.streamed;
    // What this client has already (the catch-up covered it) is not sent twice.
    if (known && known.cause === delta.cause && delta.offset !== 0 && end <= known.length) return;
    this.streamed = { cause: delta.cause, length: end };
    this.send(delta);
  }

  resync(): void {
    this.feed.resync();
  }

  // ------------------------------------------------------------- internals

  /**
   * Checks the backlog before it adds to it: a client that stopped reading is
   * closed at its next message, while one message larger than the limit (an
   * agent's longest answer, as JSON) reaches a client that reads.
   */
  private send(message: ServerEvent): void {
    this.checkBacklog();
    if (this.ended) return;
    this.options.transport.send(message);
  }

  /** Unsent: what the transport holds for the client, and what the feed holds back. */
  private checkBacklog(): void {
    if (this.ended) return;
    if (this.options.transport.unsentBytes() + this.feed.heldBytes > MAX_UNSENT_BYTES) {
      this.end('overflow');
    }
  }

  private end(why: 'expired' | 'deleted' | 'overflow'): void {
    if (this.ended) return;
    this.dispose();
    this.options.onEnd?.(why);
    // A client that stopped reading would never take a graceful end.
    this.options.transport.close(why !== 'overflow');
  }

  /** At the token's `exp` the client hears why, and the connection closes. */
  private scheduleExpiry(): void {
    const now = this.options.now ?? Date.now;
    const wait = this.options.principal.expiresAt - now();
    if (wait <= 0) {
      this.expire();
      return;
    }
    this.expiry = setTimeout(
      () => (wait > MAX_TIMER_MS ? this.scheduleExpiry() : this.expire()),
      Math.min(wait, MAX_TIMER_MS),
    );
    this.expiry.unref();
  }

  private expire(): void {
    this.sendStatus({
      status_update: true,
      type: 'error',
      id: StatusId.TokenExpired,
      message: 'the token has expired: reconnect with a fresh one',
    });
  }
}
