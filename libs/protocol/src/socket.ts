import { z } from 'zod';
import { ConversationIdSchema } from './rest.js';
import type { ServerEvent, UserActionAck } from './events.js';

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
