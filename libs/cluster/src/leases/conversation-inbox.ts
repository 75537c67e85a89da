import { masterFor, type RedisConnection } from '../redis/redis-connections.js';
import { InboxMessageSchema, type InboxMessage } from '@cs/protocol';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/** Larger wake-ups go without their events: the holder reads them from Postgres. */
const MAX_WAKE_BYTES = 64 * 1024;

export interface ConversationInboxOptions {
  /** The sender's W3C traceparent, sent with each wake-up (`currentTraceparent` of libs/observability). */
  traceparent?: () => string | undefined;
  /** A wake-up reached this holder, that many seconds after it was sent (`cs_wakeup_pickup_seconds`). */
  onWakeReceived?: (seconds: number) => void;
  /**
   * Delivers a wake-up inside a span of its sender's trace (`continueTrace`
   * of libs/observability), so that the trace of a message reaches the holder.
   */
  continueTrace?: (
    traceparent: string,
    name: string,
    deliver: () => void,
    attributes: Record<string, string>,
  ) => void;
}

/**
 * Per-conversation Redis channels to the lease holder: only the worker holding
 * a conversation subscribes to its channel, so a message reaches one node, and
 * the publish's receiver count tells a gateway whether anyone holds it at all.
 * Sharded channels (`SPUBLISH`/`SSUBSCRIBE`, in the conversation's slot): on a
 * Redis Cluster a message touches the one shard of its conversation, and the
 * count is the subscribers of that shard, where every subscriber of the
 * channel is (a classic PUBLISH would count those of the node it reached
 * only). One Redis 7 takes the same commands.
 */
export class ConversationInbox {
  private readonly handlers = new Map<
    string,
    { conversationId: string; handler: (message: InboxMessage) => void }
  >();

  /**
   * @param publisher a regular connection
   * @param subscriber a connection used only for subscriptions (null on gateways)
   */
  constructor(
    private readonly publisher: RedisConnection,
    private readonly subscriber: RedisConnection | null,
    private readonly keys: ClusterKeys,
    private readonly options: ConversationInboxOptions = {},
  ) {
    subscriber?.on('smessage', (channel: string, raw: string) => {
      const listener = this.handlers.get(channel);
      if (!listener) return;
      try {
        const parsed = InboxMessageSchema.safeParse(JSON.parse(raw));
        if (!parsed.success) return;
        const message = parsed.data;
        const deliver = () => listener.handler(message);
        if (message.type !== 'wake') return deliver();
        if (message.sent_at !== undefined)
          this.options.onWakeReceived?.((Date.now() - message.sent_at) / 1000);
        if (message.trace && this.options.continueTrace) {
          this.options.continueTrace(message.trace, 'conversation wake-up', deliver, {
            'cs.conversation_id': listener.conversationId,
          });
        } else deliver();
      } catch {
        // not ours: ignore
      }
    });
  }

  /** Sends a message; resolves with how many holders received it (0: nobody holds it). */
  send(conversationId: string, message: InboxMessage): Promise<number> {
    if (message.type === 'wake') {
      const trace = message.trace ?? this.options.traceparent?.();
      message = { ...message, sent_at: message.sent_at ?? Date.now(), ...(trace && { trace }) };
    }
    let raw = JSON.stringify(message);
    if (message.type === 'wake' && raw.length > MAX_WAKE_BYTES)
      raw = JSON.stringify({ ...message, events: undefined });
    return this.publisher.spublish(
      this.keys.conversationChannel(conversationId),
      raw,
    ) as Promise<number>;
  }

  /**
   * Calls `listener` on every sign that wake-ups may be missed: the
   * subscriber connection (or, on a Redis Cluster, one of its per-master
   * subscribers) failed or dropped. Messages published meanwhile reach no
   * one, and its channels are subscribed again only once it is back.
   */
  onListenTrouble(listener: () => void): void {
    for (const event of ['error', 'close', '-subscriber', 'nodeError'])
      this.subscriber?.on(event, () => listener());
  }

  /** How many holders listen to the conversation right now. */
  async holders(conversationId: string): Promise<number> {
    const channel = this.keys.conversationChannel(conversationId);
    // PUBSUB takes no key: it must go to the master of the channel's slot.
    const master = masterFor(this.publisher, channel);
    if (!master) return 0;
    const reply = (await master.pubsub('SHARDNUMSUB', channel)) as [string, number | string];
    return Number(reply[1] ?? 0);
  }

  async listen(conversationId: string, handler: (message: InboxMessage) => void): Promise<void> {
    if (!this.subscriber) throw new Error('this inbox has no subscriber connection');
    const channel = this.keys.conversationChannel(conversationId);
    this.handlers.set(channel, { conversationId, handler });
    await this.subscriber.ssubscribe(channel);
  }

  async unlisten(conversationId: string): Promise<void> {
    const channel = this.keys.conversationChannel(conversationId);
    if (!this.handlers.delete(channel) || !this.subscriber) return;
    await this.subscriber.sunsubscribe(channel);
  }
}
