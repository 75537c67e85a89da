import type { RoomSink } from '@cs/core';
import { RoomMessageSchema } from '@cs/protocol';
import { Cluster } from 'ioredis';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * A gateway's subscriptions to the rooms of the conversations it has
 * subscribers to: one Redis channel per conversation, subscribed while the
 * gateway's room hub holds that room open. Traffic that does not parse is
 * dropped (subscribers catch up from Postgres at the next event).
 */
export class RedisRoomSubscriber {
  private readonly sinks = new Map<string, { room: string; sink: RoomSink }>();
  private resync: (() => void) | null = null;
  private connectedOnce: boolean;

  /**
   * @param subscriber a connection used for these subscriptions only
   * @param requestCatchUp asks the holder of the room's conversation for the
   *   text its current step streamed so far (through the conversation's
   *   inbox): the reply comes on the room's channel, as a `catch_up` message
   */
  constructor(
    private readonly subscriber: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly requestCatchUp: (room: string) => void,
  ) {
    subscriber.on('smessage', (channel: string, raw: string) => this.deliver(channel, raw));
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
          () => this.resyncAll(),
          () => undefined, // closed again: the next 'ready' resyncs
        );
      });
    });
    // A Redis Cluster's client stays ready while one master fails over: its
    // subscriber of that shard is made again and subscribes again (the
    // cluster client says so with this event), and what was published
    // meanwhile on that shard is lost.
    if (subscriber instanceof Cluster) {
      subscriber.on('subscribersReady', () => {
        if (this.connectedOnce) this.resyncAll();
      });
    }
  }

  private resyncAll(): void {
    this.resync?.();
    // Deltas were lost too: the steps streaming now, from their start.
    for (const { room } of this.sinks.values()) this.catchUp(room);
  }

  /** Called after a Redis outage, once live traffic flows again. */
  onResync(resync: () => void): void {
    this.resync = resync;
  }

  /**
   * Starts delivering the conversation's traffic to `sink`; resolves once
   * Redis has confirmed the subscription, so that nothing published after
   * that is missed. A step streaming already reaches the sink as its text so
   * far (`catchUpStream`) once the holder answers. During an outage it
   * resolves at once: the subscription is made on reconnection, followed by
   * a resync.
   */
  async open(room: string, sink: RoomSink): Promise<void> {
    const channel = this.keys.conversationRoom(room);
    this.sinks.set(channel, { room, sink });
    const subscribed = this.subscriber.ssubscribe(channel);
    if (this.connectedOnce && this.subscriber.status !== 'ready') {
      subscribed.catch(() => undefined);
      return;
    }
    await subscribed;
    this.catchUp(room);
  }

  close(room: string): void {
    const channel = this.keys.conversationRoom(room);
    this.sinks.delete(channel);
    this.subscriber.sunsubscribe(channel).catch(() => undefined);
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
    else if (message.type === 'stream') sink.publishStream(room, message.delta);
    else sink.catchUpStream(room, message.delta);
  }

  private catchUp(room: string): void {
    try {
      this.requestCatchUp(room);
    } catch {
      // best effort, as the rest of the live traffic
    }
  }
}
