// What the replicas tell each other through Redis: the conversations' live
// traffic to the gateways, and messages to a conversation's lease holder.
import { z } from 'zod';
import { StatusUpdateSchema, StoredEventSchema, StreamDeltaSchema } from './events.js';

/**
 * A conversation's live traffic between replicas, on the conversation's own
 * Redis channel: workers and gateways publish what they stored (or a status,
 * or a token delta), and only the gateways with a subscriber to that
 * conversation listen. Stored events go this way rather than straight to the
 * Socket.IO room so that each gateway merges them with its replays, without
 * gaps or repeats, per connection.
 */
export const RoomMessageSchema = z.discriminatedUnion('type', [
  z.object({ type: z.literal('events'), events: z.array(StoredEventSchema).min(1) }),
  z.object({ type: z.literal('status'), status: StatusUpdateSchema }),
  z.object({ type: z.literal('stream'), delta: StreamDeltaSchema }),
  /**
   * The text the current step streamed so far, from offset 0, sent by the
   * holder when a gateway opening the room asks for it (inbox `catch_up`).
   */
  z.object({ type: z.literal('catch_up'), delta: StreamDeltaSchema }),
]);
export type RoomMessage = z.infer<typeof RoomMessageSchema>;

/**
 * The W3C `traceparent` of the span that stored a user message (docs/protocol.md
 * "Operations", traces): the holder continues that trace. A malformed one is
 * dropped, never the message that carries it.
 */
export const TraceparentSchema = z
  .string()
  .regex(/^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/)
  .optional()
  .catch(undefined);

/** What a gateway tells a conversation's lease holder, on the holder's inbox channel. */
export const InboxMessageSchema = z.discriminatedUnion('type', [
  /**
   * New user events are stored: read them. They come along when small, so
   * that the holder need not read them back from Postgres. `trace` continues
   * the sender's trace; `sent_at` (ms since the epoch) times the pickup.
   */
  z.object({
    type: z.literal('wake'),
    events: z.array(StoredEventSchema).optional(),
    trace: TraceparentSchema,
    sent_at: z.number().int().nonnegative().optional().catch(undefined),
  }),
  /** Stop the conversation (REST stop, delete). */
  z.object({ type: z.literal('stop') }),
  /** Stop it because its user started one too many (evict_oldest). */
  z.object({ type: z.literal('evict') }),
  /**
   * A gateway opened the conversation's room: publish the current step's
   * text so far on the room (a `catch_up` room message), if one streams.
   */
  z.object({ type: z.literal('catch_up') }),
  /** A PATCH stored new settings: the session reads them again (`settingsChanged`). */
  z.object({ type: z.literal('settings') }),
]);
export type InboxMessage = z.infer<typeof InboxMessageSchema>;

/**
 * A conversation stored `app:` keys (`app`) or `user:` keys (`user`): on the
 * deployment's one channel of these, to every worker, whose sessions that
 * share them read them again before their next step. The shape of
 * `ScopedStateChange` of libs/core.
 */
export const ScopedStateChangeSchema = z.object({
  tenantId: z.string(),
  appName: z.string(),
  userId: z.string(),
  app: z.boolean(),
  user: z.boolean(),
  origin: z.string(),
});
