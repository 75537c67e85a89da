// A conversation attached over Socket.IO: `client.conversation(id)`.
//
// Its parts: the connection loop (conversation-connection.ts: one fresh
// socket per attempt, resuming from the last event id, fresh tokens,
// backoff), the user actions awaiting an acknowledgement (user-action-queue.ts:
// resent with their `client_event_id` on every new connection, one stored
// event however often sent), the `events()` iterators (event-queue.ts) and the
// streamed text (streamed-text.ts). Here: what arrives is told apart and
// delivered. Stored events are delivered once, in id order (anything at or
// below `lastEventId` is a repeat and dropped).
import { ConversationConnection, type ConnectionState } from './conversation-connection.js';
import type { ConversationsApi } from './conversations-api.js';
import { ConversationServiceError } from './errors.js';
import { EventQueue, readStoredEvents } from './event-queue.js';
import { StreamedText } from './streamed-text.js';
import type { TokenSource } from './token-source.js';
import { UserActionQueue, newClientEventId } from './user-action-queue.js';
import {
  agentStateOf,
  hasEventId,
  isAgentMessage,
  isStatusUpdate,
  isStreamDelta,
} from './wire-guards.js';
import type {
  AgentState,
  ObservationEvent,
  RequestableAgentState,
  StatusUpdate,
  StoredEvent,
  UserActionPayload,
} from './wire.js';

export type { ConnectionState } from './conversation-connection.js';
export { newClientEventId } from './user-action-queue.js';

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

/**
 * A rewind arrived live: every event after `toEventId` and before
 * `rewind.id` that was not undone yet is undone by it now (events read
 * back later carry `undone_by: rewind.id`). A UI folds them.
 */
export interface UndoneUpdate {
  rewind: StoredEvent;
  toEventId: number;
}

export interface LiveConversationListeners {
  event: (event: StoredEvent) => void;
  undone: (undone: UndoneUpdate) => void;
  status: (status: StatusUpdate) => void;
  delta: (delta: DeltaUpdate) => void;
  agent_state: (state: AgentState, event: ObservationEvent) => void;
  /** `error` is set when the conversation closed because of a failure. */
  connection: (state: ConnectionState, error?: ConversationServiceError) => void;
}

export class LiveConversation {
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
    undone: new Set(),
    status: new Set(),
    delta: new Set(),
    agent_state: new Set(),
    connection: new Set(),
  };
  private readonly link: ConversationConnection;
  private readonly actions: UserActionQueue;
  private readonly queues = new Set<EventQueue>();
  private ended = false;
  private connecting: Promise<void> | undefined;
  private settleConnect: { resolve: () => void; reject: (error: unknown) => void } | undefined;

  constructor(
    readonly id: string,
    options: LiveConversationOptions,
    endpoint: { origin: string; path: string },
    tokens: TokenSource,
    private readonly api: ConversationsApi,
  ) {
    this.fromEventId = options.latestEventId ?? -1;
    this._lastEventId = this.fromEventId;
    this.link = new ConversationConnection(id, options.start ?? true, endpoint, tokens, {
      resumeAfter: () => this._lastEventId,
      state: (state) => this.setConnection(state),
      attached: () => this.onAttached(),
      detached: () => this.actions.unanswered(),
      message: (message) => this.receive(message),
      failed: (error) => this.end(error),
    });
    this.actions = new UserActionQueue(this.link, () => this.connectInBackground());
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
      void this.link.open();
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
        queue.backfill(
          readStoredEvents(this.api, this.id, this.fromEventId + 1, this._lastEventId),
        );
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

  // ---------------------------------------------------------------- connection

  private connectInBackground(): void {
    // Failures reach the caller through events(), send() and `connection`.
    this.connect().catch(() => undefined);
  }

  private onAttached(): void {
    this.setConnection('connected');
    this.settleConnect?.resolve();
    this.settleConnect = undefined;
    this.actions.resend();
  }

  private end(error: ConversationServiceError | undefined): void {
    if (this.ended) return;
    this.ended = true;
    this._error = error;
    this.link.close();
    const reason = error ?? closedError();
    this.settleConnect?.reject(reason);
    this.settleConnect = undefined;
    this.actions.rejectAll(reason);
    for (const queue of this.queues) queue.end(error);
    this.queues.clear();
    this.setConnection('closed', error);
  }

  private enqueue(key: string, payload: UserActionPayload): Promise<{ eventId: number }> {
    // Nothing is pending once closed: a repeated key is refused like a new one.
    if (this.ended) return Promise.reject(this._error ?? closedError());
    return this.actions.send(key, payload);
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
      const toEventId = rewindTargetOf(message);
      if (toEventId !== null) this.emit('undone', { rewind: message, toEventId });
      if (state !== undefined) {
        this._agentState = state;
        this.emit('agent_state', state, message as ObservationEvent);
      }
    } else if (isStatusUpdate(message)) {
      // The connection has read what a status means for it (an expired token, a deletion).
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
}

/** The point a stored rewind event (`{ source: "user", action: "rewind" }`) went back to. */
function rewindTargetOf(event: StoredEvent): number | null {
  if (event.source !== 'user' || !('action' in event) || event.action !== 'rewind') return null;
  const target = event.args['to_event_id'];
  return typeof target === 'number' ? target : null;
}

function closedError(): ConversationServiceError {
  return new ConversationServiceError('UNAVAILABLE', 'the conversation was closed');
}
