// A conversation attached over Socket.IO: `client.conversation(id)`.
//
// The connection loop is the SDK's own (one fresh socket per attempt, no
// socket.io reconnection), so that every attempt carries the last event id
// received and the current token, whatever ended the previous one: a dropped
// transport, a gateway that drained or died, a server that closed the socket
// because its token expired. Stored events are delivered once, in id order
// (anything at or below `lastEventId` is a repeat and dropped); user actions
// keep their `client_event_id` and are resent on every new connection until
// acknowledged, which the server turns into one stored event.
import { io, type Socket } from 'socket.io-client';
import type { ConversationsApi } from './conversations-api.js';
import { ConversationServiceError } from './errors.js';
import { StreamedText } from './streamed-text.js';
import type { TokenSource } from './token-source.js';
import {
  agentStateOf,
  hasEventId,
  isAgentMessage,
  isStatusUpdate,
  isStreamDelta,
  isUserActionAck,
} from './wire-guards.js';
import type {
  AgentState,
  ObservationEvent,
  RequestableAgentState,
  StatusUpdate,
  StoredEvent,
  UserActionAck,
  UserActionPayload,
} from './wire.js';

export type ConnectionState = 'connecting' | 'connected' | 'reconnecting' | 'closed';

export interface LiveConversationOptions {
  /** Start the agent when attaching (default true; reconnects never start it). */
  start?: boolean;
  /** The last event id the caller has already (default -1: replay everything). */
  latestEventId?: number;
}

/** A streamed delta as listeners receive it, with the turn's text so far. */
export interface DeltaUpdate {
  cause: number;
  delta: string;
  offset: number;
  text: string;
}

export interface LiveConversationListeners {
  event: (event: StoredEvent) => void;
  status: (status: StatusUpdate) => void;
  delta: (delta: DeltaUpdate) => void;
  agent_state: (state: AgentState, event: ObservationEvent) => void;
  /** `error` is set when the conversation closed because of a failure. */
  connection: (state: ConnectionState, error?: ConversationServiceError) => void;
}

interface PendingAction {
  key: string;
  payload: UserActionPayload;
  promise: Promise<{ eventId: number }>;
  resolve: (value: { eventId: number }) => void;
  reject: (error: ConversationServiceError) => void;
  /** The socket the action was last sent on and is awaiting an answer from. */
  inFlight: Socket | null;
}

const CONNECT_TIMEOUT_MS = 10_000;
const ACK_TIMEOUT_MS = 15_000;
const RETRY_BASE_MS = 250;
const RETRY_MAX_MS = 5_000;

export class LiveConversation {
  private readonly startOnAttach: boolean;
  private readonly fromEventId: number;
  private _lastEventId: number;
  private _agentState: AgentState | null = null;
  private _connection: ConnectionState = 'closed';
  private _error: ConversationServiceError | undefined;
  private readonly streams = new StreamedText();
  private readonly listeners: {
    [K in keyof LiveConversationListeners]: Set<LiveConversationListeners[K]>;
  } = {
    event: new Set(),
    status: new Set(),
    delta: new Set(),
    agent_state: new Set(),
    connection: new Set(),
  };
  private readonly pending = new Map<string, PendingAction>();
  private readonly queues = new Set<EventQueue>();

  private socket: Socket | undefined;
  private socketToken: string | undefined;
  private attached = false;
  private ended = false;
  private retries = 0;
  private retryTimer: ReturnType<typeof setTimeout> | undefined;
  /** The server said the token expired (or refused it): ask `getToken` before the next attempt. */
  private staleToken: { token: string | undefined } | undefined;
  private refusedAfterRefresh = false;
  private deleted = false;
  private connecting: Promise<void> | undefined;
  private settleConnect: { resolve: () => void; reject: (error: unknown) => void } | undefined;

  constructor(
    readonly id: string,
    options: LiveConversationOptions,
    private readonly endpoint: { origin: string; path: string },
    private readonly tokens: TokenSource,
    private readonly api: ConversationsApi,
  ) {
    this.startOnAttach = options.start ?? true;
    this.fromEventId = options.latestEventId ?? -1;
    this._lastEventId = this.fromEventId;
  }

  /** The id of the last stored event received (or `latestEventId` until one arrives). */
  get lastEventId(): number {
    return this._lastEventId;
  }

  /** The agent state of the last `agent_state_changed` received, or null. */
  get agentState(): AgentState | null {
    return this._agentState;
  }

  get connection(): ConnectionState {
    return this._connection;
  }

  /** Why the conversation closed, when a failure closed it. */
  get error(): ConversationServiceError | undefined {
    return this._error;
  }

  /** Resolves once attached; rejects when the service refuses for good (NOT_FOUND, …). */
  connect(): Promise<void> {
    if (this.ended) return Promise.reject(this._error ?? closedError());
    this.connecting ??= new Promise<void>((resolve, reject) => {
      this.settleConnect = { resolve, reject };
      this.setConnection('connecting');
      void this.open();
    });
    return this.connecting;
  }

  /**
   * The stored events after `latestEventId`, replayed then live, each once and
   * in id order across reconnects. An iterator opened after events arrived
   * reads those first through REST. Ends when the conversation is closed.
   */
  events(): AsyncIterableIterator<StoredEvent> {
    const queue = new EventQueue(this.fromEventId, (queue) => this.queues.delete(queue));
    if (this.ended) queue.end(this._error);
    else {
      if (this._lastEventId > this.fromEventId) {
        queue.backfill(this.readStored(this.fromEventId + 1, this._lastEventId));
      }
      this.queues.add(queue);
      this.connectInBackground();
    }
    return queue;
  }

  on<K extends keyof LiveConversationListeners>(
    name: K,
    listener: LiveConversationListeners[K],
  ): () => void {
    this.listeners[name].add(listener);
    return () => this.off(name, listener);
  }

  off<K extends keyof LiveConversationListeners>(
    name: K,
    listener: LiveConversationListeners[K],
  ): void {
    this.listeners[name].delete(listener);
  }

  /**
   * Sends a user message; resolves with the stored event's id. Resent with the
   * same `client_event_id` on every reconnect until the server answers: stored
   * once however often it was sent.
   */
  send(content: string, options: { clientEventId?: string } = {}): Promise<{ eventId: number }> {
    const key = options.clientEventId ?? newClientEventId();
    return this.enqueue(key, { action: 'message', args: { content }, client_event_id: key });
  }

  /** `stopped`, `paused`, `running`, or the answer to a pending confirmation. */
  setAgentState(
    state: RequestableAgentState,
    options: { clientEventId?: string } = {},
  ): Promise<{ eventId: number }> {
    const key = options.clientEventId ?? newClientEventId();
    return this.enqueue(key, {
      action: 'change_agent_state',
      args: { agent_state: state },
      client_event_id: key,
    });
  }

  /** The text streamed so far for the turn answering `cause`; its stored answer once there. */
  streamingText(cause: number): string {
    return this.streams.text(cause);
  }

  close(): void {
    this.end(undefined);
  }

  // ------------------------------------------------------------ connection loop

  private connectInBackground(): void {
    // Failures reach the caller through events(), send() and `connection`.
    this.connect().catch(() => undefined);
  }

  private async open(): Promise<void> {
    this.retryTimer = undefined;
    if (this.ended) return;
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
    if (this.ended) return;
    const socket = io(this.endpoint.origin, {
      path: this.endpoint.path,
      transports: ['websocket'],
      auth: token === undefined ? {} : { token },
      query: {
        conversation_id: this.id,
        latest_event_id: String(this._lastEventId),
        start: String(this.startOnAttach && !this.attached),
      },
      reconnection: false,
      forceNew: true,
      timeout: CONNECT_TIMEOUT_MS,
    });
    this.socket = socket;
    this.socketToken = token;
    socket.on('connect', () => {
      if (this.current(socket)) this.onAttached();
    });
    socket.on('connect_error', (error: Error & { data?: unknown }) => {
      if (this.current(socket)) this.onRefused(socket, error);
    });
    socket.on('disconnect', (reason: string) => {
      if (this.current(socket)) this.onDisconnected(reason);
    });
    socket.on('oh_event', (message: unknown) => {
      if (this.current(socket)) this.receive(message);
    });
  }

  private current(socket: Socket): boolean {
    return socket === this.socket && !this.ended;
  }

  private onAttached(): void {
    this.attached = true;
    this.retries = 0;
    this.refusedAfterRefresh = false;
    this.setConnection('connected');
    this.settleConnect?.resolve();
    this.settleConnect = undefined;
    for (const action of this.pending.values()) {
      if (action.inFlight === null) this.transmit(action);
    }
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
      this.end(new ConversationServiceError(code, message));
      return;
    }
    // Unreachable, timed out, RATE_LIMITED, UNAVAILABLE: the next attempt may do.
    this.scheduleRetry();
  }

  private onDisconnected(reason: string): void {
    this.socket = undefined;
    for (const action of this.pending.values()) action.inFlight = null;
    if (this.deleted) {
      this.end(new ConversationServiceError('NOT_FOUND', 'the conversation was deleted'));
      return;
    }
    this.setConnection('reconnecting');
    // A server that closed the socket on purpose (drain, expired token) lets us retry at once.
    if (reason === 'io server disconnect' && this.retries === 0) {
      this.retries = 1;
      void this.open();
    } else this.scheduleRetry();
  }

  private scheduleRetry(): void {
    if (this.ended || this.retryTimer !== undefined) return;
    const ceiling = Math.min(RETRY_MAX_MS, RETRY_BASE_MS * 2 ** this.retries);
    this.retries += 1;
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.setConnection(this.attached ? 'reconnecting' : 'connecting');
    this.retryTimer = setTimeout(() => void this.open(), delay);
  }

  private end(error: ConversationServiceError | undefined): void {
    if (this.ended) return;
    this.ended = true;
    this._error = error;
    if (this.retryTimer !== undefined) clearTimeout(this.retryTimer);
    this.socket?.close();
    this.socket = undefined;
    const reason = error ?? closedError();
    this.settleConnect?.reject(reason);
    this.settleConnect = undefined;
    for (const action of this.pending.values()) action.reject(reason);
    this.pending.clear();
    for (const queue of this.queues) queue.end(error);
    this.queues.clear();
    this.setConnection('closed', error);
  }

  // ------------------------------------------------------------------ receiving

  private receive(message: unknown): void {
    if (hasEventId(message)) {
      if (message.id <= this._lastEventId) return; // a repeat: delivered once already
      this._lastEventId = message.id;
      if (isAgentMessage(message)) this.streams.finish(message.cause, message.args.content);
      const state = agentStateOf(message);
      this.emit('event', message);
      for (const queue of this.queues) queue.push(message);
      if (state !== undefined) {
        this._agentState = state;
        this.emit('agent_state', state, message as ObservationEvent);
      }
    } else if (isStatusUpdate(message)) {
      if (message.id === 'STATUS$TOKEN_EXPIRED') this.staleToken = { token: this.socketToken };
      if (message.id === 'STATUS$CONVERSATION_DELETED') this.deleted = true;
      this.emit('status', message);
    } else if (isStreamDelta(message)) {
      const offset = message.offset ?? this.streams.text(message.cause).length;
      if (this.streams.apply(message.cause, offset, message.delta)) {
        this.emit('delta', {
          cause: message.cause,
          delta: message.delta,
          offset,
          text: this.streams.text(message.cause),
        });
      }
    }
    // Anything else is a shape this SDK does not know: ignored.
  }

  private emit<K extends keyof LiveConversationListeners>(
    name: K,
    ...args: Parameters<LiveConversationListeners[K]>
  ): void {
    for (const listener of [...this.listeners[name]]) {
      try {
        (listener as (...values: unknown[]) => void)(...args);
      } catch (error) {
        // A listener's bug must not stop delivery to the others: report it apart.
        setTimeout(() => {
          throw error;
        });
      }
    }
  }

  private setConnection(state: ConnectionState, error?: ConversationServiceError): void {
    if (this._connection === state) return;
    this._connection = state;
    this.emit('connection', state, error);
  }

  // ------------------------------------------------------------------- sending

  private enqueue(key: string, payload: UserActionPayload): Promise<{ eventId: number }> {
    const existing = this.pending.get(key);
    if (existing) return existing.promise;
    if (this.ended) return Promise.reject(this._error ?? closedError());
    let settle!: Pick<PendingAction, 'resolve' | 'reject'>;
    const promise = new Promise<{ eventId: number }>((resolve, reject) => {
      settle = { resolve, reject };
    });
    const action: PendingAction = { key, payload, promise, ...settle, inFlight: null };
    this.pending.set(key, action);
    if (this.socket?.connected) this.transmit(action);
    else this.connectInBackground();
    return promise;
  }

  private transmit(action: PendingAction): void {
    const socket = this.socket;
    if (!socket?.connected) return;
    action.inFlight = socket;
    socket
      .timeout(ACK_TIMEOUT_MS)
      .emit('oh_user_action', action.payload, (error: Error | null, ack: UserActionAck) => {
        if (action.inFlight === socket) action.inFlight = null;
        if (this.pending.get(action.key) !== action) return;
        if (error || !isUserActionAck(ack)) {
          // No answer (timed out, or the connection went): send again on a live one.
          if (this.current(socket) && socket.connected) this.transmit(action);
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

  // -------------------------------------------------------------------- backfill

  private async *readStored(fromId: number, toId: number): AsyncGenerator<StoredEvent> {
    let start = fromId;
    while (start <= toId) {
      const page = await this.api.events(this.id, { start_id: start, end_id: toId, limit: 100 });
      for (const event of page.events) {
        yield event;
        start = Math.max(start, event.id + 1);
      }
      if (!page.has_more || page.events.length === 0) return;
    }
  }
}

/**
 * One `events()` iterator: events pushed live, after those read back through
 * REST when it was opened late; each id once, in order.
 */
class EventQueue implements AsyncIterableIterator<StoredEvent> {
  private readonly buffered: StoredEvent[] = [];
  private lastId: number;
  private backfilling: AsyncIterator<StoredEvent> | undefined;
  private finished = false;
  private failure: ConversationServiceError | undefined;
  private wake: (() => void) | undefined;

  constructor(
    fromEventId: number,
    private readonly onClose: (queue: EventQueue) => void,
  ) {
    this.lastId = fromEventId;
  }

  backfill(source: AsyncIterable<StoredEvent>): void {
    this.backfilling = source[Symbol.asyncIterator]();
  }

  push(event: StoredEvent): void {
    this.buffered.push(event);
    this.wake?.();
  }

  end(error: ConversationServiceError | undefined): void {
    this.finished = true;
    this.failure = error;
    this.wake?.();
  }

  async next(): Promise<IteratorResult<StoredEvent>> {
    for (;;) {
      if (this.backfilling) {
        const read = await this.backfilling.next();
        if (!read.done) {
          if (read.value.id > this.lastId) return this.yield(read.value);
          continue;
        }
        this.backfilling = undefined;
      }
      const event = this.buffered.shift();
      if (event) {
        if (event.id > this.lastId) return this.yield(event);
        continue;
      }
      if (this.finished) {
        this.onClose(this);
        if (this.failure) {
          const failure = this.failure;
          this.failure = undefined;
          throw failure;
        }
        return { done: true, value: undefined };
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }

  return(): Promise<IteratorResult<StoredEvent>> {
    this.finished = true;
    this.buffered.length = 0;
    this.backfilling = undefined;
    this.onClose(this);
    return Promise.resolve({ done: true, value: undefined });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<StoredEvent> {
    return this;
  }

  private yield(event: StoredEvent): IteratorResult<StoredEvent> {
    this.lastId = event.id;
    return { done: false, value: event };
  }
}

function closedError(): ConversationServiceError {
  return new ConversationServiceError('UNAVAILABLE', 'the conversation was closed');
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
