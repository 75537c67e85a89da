// User actions on their way to the server. Each keeps its `client_event_id`
// and is sent again on every new connection, and after a send left
// unanswered, until the server acknowledges it: the server turns however many
// sends into one stored event.
import type { Socket } from 'socket.io-client';
import { RETRY_MAX_MS } from './conversation-connection.js';
import { ConversationServiceError } from './errors.js';
import { isUserActionAck } from './wire-guards.js';
import type { UserActionAck, UserActionPayload } from './wire.js';

const ACK_TIMEOUT_MS = 15_000;

interface PendingAction {
  key: string;
  payload: UserActionPayload;
  promise: Promise<{ eventId: number }>;
  resolve: (value: { eventId: number }) => void;
  reject: (error: ConversationServiceError) => void;
  /** The socket the action was last sent on and is awaiting an answer from. */
  inFlight: Socket | null;
}

/** Where actions are sent: the conversation's connection. */
export interface ActionChannel {
  /** The current socket while it is connected. */
  readonly connectedSocket: Socket | undefined;
  isCurrent(socket: Socket): boolean;
}

export class UserActionQueue {
  private readonly pending = new Map<string, PendingAction>();

  constructor(
    private readonly channel: ActionChannel,
    /** Called when an action waits for a connection. */
    private readonly connect: () => void,
  ) {}

  /** Resolves with the stored event's id; an action pending under `key` already is not sent twice. */
  send(key: string, payload: UserActionPayload): Promise<{ eventId: number }> {
    const existing = this.pending.get(key);
    if (existing) return existing.promise;
    let settle!: Pick<PendingAction, 'resolve' | 'reject'>;
    const promise = new Promise<{ eventId: number }>((resolve, reject) => {
      settle = { resolve, reject };
    });
    const action: PendingAction = { key, payload, promise, ...settle, inFlight: null };
    this.pending.set(key, action);
    if (this.channel.connectedSocket) this.transmit(action);
    else this.connect();
    return promise;
  }

  /** A new connection: sends every action that awaits no answer. */
  resend(): void {
    for (const action of this.pending.values()) {
      if (action.inFlight === null) this.transmit(action);
    }
  }

  /** The connection went: nothing sent on it will be answered. */
  unanswered(): void {
    for (const action of this.pending.values()) action.inFlight = null;
  }

  rejectAll(reason: ConversationServiceError): void {
    for (const action of this.pending.values()) action.reject(reason);
    this.pending.clear();
  }

  private transmit(action: PendingAction): void {
    const socket = this.channel.connectedSocket;
    if (!socket) return;
    action.inFlight = socket;
    socket
      .timeout(ACK_TIMEOUT_MS)
      .emit('oh_user_action', action.payload, (error: Error | null, ack: UserActionAck) => {
        if (action.inFlight === socket) action.inFlight = null;
        if (this.pending.get(action.key) !== action) return;
        if (error || !isUserActionAck(ack)) {
          // No answer (timed out, or the connection went): send again on a live one.
          if (this.channel.isCurrent(socket) && socket.connected) this.transmit(action);
          return;
        }
        if (ack.ok) {
          this.pending.delete(action.key);
          action.resolve({ eventId: ack.event_id });
        } else if (ack.error.code === 'UNAVAILABLE') {
          setTimeout(() => {
            if (this.pending.get(action.key) === action && action.inFlight === null)
              this.transmit(action);
          }, RETRY_MAX_MS);
        } else {
          this.pending.delete(action.key);
          action.reject(
            new ConversationServiceError(
              ack.error.code,
              ack.error.message,
              ack.error.field ? { field: ack.error.field } : {},
            ),
          );
        }
      });
  }
}

/** A UUID v4; `crypto.randomUUID` needs a secure context, `getRandomValues` does not. */
export function newClientEventId(): string {
  const cryptoApi = globalThis.crypto;
  if (typeof cryptoApi.randomUUID === 'function') return cryptoApi.randomUUID();
  const bytes = cryptoApi.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
