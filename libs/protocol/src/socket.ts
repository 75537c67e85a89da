import { z } from 'zod';
import { ConversationIdSchema } from './rest.js';
import {
  StatusUpdateSchema,
  StoredEventSchema,
  StreamDeltaSchema,
  type ServerEvent,
  type UserActionAck,
} from './events.js';

/** The Socket.IO handshake query (`conversation_id`, `latest_event_id`, `start`). */
export const ConnectQuerySchema = z.object({
  conversation_id: ConversationIdSchema,
  latest_event_id: z
    .string()
    .regex(/^-?\d{1,16}$/, 'must be an integer')
    .transform(Number)
    .pipe(z.number().int().min(-1))
    .default(-1),
  start: z
    .enum(['true', 'false'])
    .transform((v) => v === 'true')
    .default(true),
});
export type ConnectQuery = z.infer<typeof ConnectQuerySchema>;

export const SocketEvents = {
  UserAction: 'oh_user_action',
  Event: 'oh_event',
} as const;

/** Typed Socket.IO event maps, so that every emit is compile-checked. */
export interface ServerToClientEvents {
  oh_event: (event: ServerEvent) => void;
}
export interface ClientToServerEvents {
  oh_user_action: (payload: unknown, ack?: (response: UserActionAck) => void) => void;
}

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
]);
export type RoomMessage = z.infer<typeof RoomMessageSchema>;
