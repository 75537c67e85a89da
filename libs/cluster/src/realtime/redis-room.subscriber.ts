import type { ConversationBroadcaster } from '@cs/core';
import { RoomMessageSchema } from '@cs/protocol';
import type { Redis } from 'ioredis';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { decodeStreamText } from './stream-text-snapshot.js';

/**
 * A gateway's subscriptions to the rooms of the conversations it has
 * subscribers to: one Redis channel per conversation, subscribed while the
 * gateway's room hub holds that room open. Traffic that does not parse is
 * dropped (subscribers catch up from Postgres at the next event).
 */
export class RedisRoomSubscriber {
  private readonly sinks = new Map<string, { room: string; sink: ConversationBroadcaster }>();
  private resync: (() => void) | null = null;
  private connectedOnce: boolean;

  /**
   * @param subscriber a connection used for these subscriptions only
   * @param reader a command connection, for the step texts kept in Redis (a
   *   connection in subscriber mode may send no other command)
   */
  constructor(
    private readonly subscriber: Redis,
    private readonly keys: ClusterKeys,
    private readonly reader: Pick<Redis, 'get'>,
  ) {
    subscriber.on('message', (channel: string, raw: string) => this.deliver(channel, raw));
    // After an outage ioredis subscribes again once it is ready; what was
    // published meanwhile is lost, so the rooms catch up from the store once
    // the subscriptions are back (a PING is answered after them).
    let ready = subscriber.status === 'ready';
    this.connectedOnce = ready;
    subscriber.on('close', () => (ready = false));
    subscriber.on('ready', () => {
      const reconnected = this.connectedOnce && !ready;
      ready = true;
      this.connectedOnce = true;
      if (!reconnected) return;
      setImmediate(() => {
        subscriber.ping().then(
          () => this.resync?.(),
          () => undefined, // closed again: the next 'ready' resyncs
        );
      });
    });
  }

  /** Called after a Redis outage, once live traffic flows again. */
  onResync(resync: () => void): void {
    this.resync = resync;
  }

  /**
   * Starts delivering the conversation's traffic to `sink`; resolves once
   * Redis has confirmed the subscription, so that nothing published after
   * that is missed. During an outage it resolves at once: the subscription
   * is made on reconnection, followed by a resync.
   */
  async open(room: string, sink: ConversationBroadcaster): Promise<void> {
    const channel = this.keys.conversationRoom(room);
    this.sinks.set(channel, { room, sink });
    const subscribed = this.subscriber.subscribe(channel);
    if (this.connectedOnce && this.subscriber.status !== 'ready') {
      subscribed.catch(() => undefined);
      return;
    }
    await subscribed;
    // A step streaming already: its text so far, before the deltas that follow.
    const stored = await this.reader.get(this.keys.roomStream(room)).catch(() => null);
    const snapshot = stored === null ? null : decodeStreamText(stored);
    if (snapshot && this.sinks.get(channel)?.sink === sink) {
      sink.publishStream(room, {
        stream: true,
        cause: snapshot.cause,
        delta: snapshot.text,
        offset: 0,
      });
    }
  }

  close(room: string): void {
    const channel = this.keys.conversationRoom(room);
    this.sinks.delete(channel);
    this.subscriber.unsubscribe(channel).catch(() => undefined);
  }

  disconnect(): void {
    this.subscriber.disconnect();
  }

  private deliver(channel: string, raw: string): void {
    const target = this.sinks.get(channel);
    if (!target) return;
    let parsed;
    try {
      parsed = RoomMessageSchema.safeParse(JSON.parse(raw));
    } catch {
      return;
    }
    if (!parsed.success) return;
    const { room, sink } = target;
    const message = parsed.data;
    if (message.type === 'events') sink.publishEvents(room, message.events);
    else if (message.type === 'status') sink.publishStatus(room, message.status);
    else sink.publishStream(room, message.delta);
  }
}
