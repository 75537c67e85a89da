// The connection loop of a live conversation. It is the SDK's own (one fresh
// socket per attempt, no socket.io reconnection), so that every attempt
// carries the last event id received and the current token, whatever ended
// the previous one: a dropped transport, a gateway that drained or died, a
// server that closed the socket because its token expired. A refusal for good
// (NOT_FOUND, BAD_REQUEST, UNAUTHORIZED after one fresh token) or a deleted
// conversation ends it; anything else is retried with backoff.
import { io, type Socket } from 'socket.io-client';
import { ConversationServiceError } from './errors.js';
import type { TokenSource } from './token-source.js';
import { backoffDelay } from './protocol/backoff.js';
import { isStatusUpdate } from './wire-guards.js';

export type ConnectionState = 'connecting' | 'connected' | 'reconnecting' | 'closed';

const CONNECT_TIMEOUT_MS = 10_000;
const RETRY_BASE_MS = 250;
/** The longest wait between two attempts. */
export const RETRY_MAX_MS = 5_000;

/** What the connection tells its conversation. */
export interface ConnectionEvents {
  /** Each attempt resumes after this event id. */
  resumeAfter(): number;
  /** `closed` is the conversation's own to say, when it ends. */
  state(state: Exclude<ConnectionState, 'closed'>): void;
  attached(): void;
  /** The socket went: whatever was sent on it is unanswered. */
  detached(): void;
  /** What the server sends as `oh_event` on the current socket. */
  message(message: unknown): void;
  /** Refused for good, or the conversation was deleted: the conversation ends. */
  failed(error: ConversationServiceError): void;
}

export class ConversationConnection {
  private socket: Socket | undefined;
  private socketToken: string | undefined;
  private attached = false;
  private closed = false;
  private retries = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** The server said the token expired (or refused it): ask `getToken` before the next attempt. */
  private staleToken: { token: string | undefined } | undefined;
  private refusedAfterRefresh = false;
  private deleted = false;

  constructor(
    private readonly conversationId: string,
    private readonly startOnAttach: boolean,
    private readonly endpoint: { origin: string; path: string },
    private readonly tokens: TokenSource,
    private readonly events: ConnectionEvents,
  ) {}

  /** The current socket while it is connected. */
  get connectedSocket(): Socket | undefined {
    return this.socket?.connected ? this.socket : undefined;
  }

  /** Whether `socket` is still the one this connection uses. */
  isCurrent(socket: Socket): boolean {
    return socket === this.socket && !this.closed;
  }

  /** One attempt; on failure, the next is scheduled (or the conversation told it failed). */
  async open(): Promise<void> {
    this.retryTimer = undefined;
    if (this.closed) return;
    let token: string | undefined;
    try {
      const stale = this.staleToken;
      this.staleToken = undefined;
      token = stale ? await this.tokens.refresh(stale.token) : await this.tokens.current();
    } catch {
      // getToken failed (offline, signed out): try again later.
      this.scheduleRetry();
      return;
    }
    if (this.closed) return;
    const socket = io(this.endpoint.origin, {
      path: this.endpoint.path,
      transports: ['websocket'],
      auth: token === undefined ? {} : { token },
      query: {
        conversation_id: this.conversationId,
        latest_event_id: String(this.events.resumeAfter()),
        start: String(this.startOnAttach && !this.attached),
      },
      reconnection: false,
      forceNew: true,
      timeout: CONNECT_TIMEOUT_MS,
    });
    this.socket = socket;
    this.socketToken = token;
    socket.on('connect', () => {
      if (this.isCurrent(socket)) this.onAttached();
    });
    socket.on('connect_error', (error: Error & { data?: unknown }) => {
      if (this.isCurrent(socket)) this.onRefused(socket, error);
    });
    socket.on('disconnect', (reason: string) => {
      if (this.isCurrent(socket)) this.onDisconnected(reason);
    });
    socket.on('oh_event', (message: unknown) => {
      if (!this.isCurrent(socket)) return;
      if (isStatusUpdate(message)) this.noteStatus(message.id);
      this.events.message(message);
    });
  }

  /** For good: no attempt follows. */
  close(): void {
    this.closed = true;
    if (this.retryTimer !== undefined) clearTimeout(this.retryTimer);
    this.socket?.close();
    this.socket = undefined;
  }

  /** Status updates after which the server closes this socket: what the next attempt does. */
  private noteStatus(id: string): void {
    if (id === 'STATUS$TOKEN_EXPIRED') this.staleToken = { token: this.socketToken };
    if (id === 'STATUS$CONVERSATION_DELETED') this.deleted = true;
  }

  private onAttached(): void {
    this.attached = true;
    this.retries = 0;
    this.refusedAfterRefresh = false;
    this.events.attached();
  }

  private onRefused(socket: Socket, error: Error & { data?: unknown }): void {
    socket.close();
    this.socket = undefined;
    const data = error.data as { code?: unknown; message?: unknown } | undefined;
    const code = typeof data?.code === 'string' ? data.code : undefined;
    const message = typeof data?.message === 'string' ? data.message : error.message;
    if (code === 'UNAUTHORIZED' && this.tokens.canRefresh && !this.refusedAfterRefresh) {
      this.refusedAfterRefresh = true;
      this.staleToken = { token: this.socketToken };
      void this.open();
      return;
    }
    if (code === 'UNAUTHORIZED' || code === 'NOT_FOUND' || code === 'BAD_REQUEST') {
      this.events.failed(new ConversationServiceError(code, message));
      return;
    }
    // Unreachable, timed out, RATE_LIMITED, UNAVAILABLE: the next attempt may do.
    this.scheduleRetry();
  }

  private onDisconnected(reason: string): void {
    this.socket = undefined;
    this.events.detached();
    if (this.deleted) {
      this.events.failed(new ConversationServiceError('NOT_FOUND', 'the conversation was deleted'));
      return;
    }
    this.events.state('reconnecting');
    // A server that closed the socket on purpose (drain, expired token) lets us retry at once.
    if (reason === 'io server disconnect' && this.retries === 0) {
      this.retries = 1;
      void this.open();
    } else this.scheduleRetry();
  }

  private scheduleRetry(): void {
    if (this.closed || this.retryTimer !== undefined) return;
    const delay = backoffDelay(this.retries, {
      baseMs: RETRY_BASE_MS,
      maxMs: RETRY_MAX_MS,
      jitter: [0.5, 1],
    });
    this.retries += 1;
    this.events.state(this.attached ? 'reconnecting' : 'connecting');
    this.retryTimer = setTimeout(() => void this.open(), delay);
  }
}
