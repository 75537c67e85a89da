import { Inject, Logger } from '@nestjs/common';
import {
  WebSocketGateway,
  WebSocketServer,
  type OnGatewayConnection,
  type OnGatewayDisconnect,
  type OnGatewayInit,
} from '@nestjs/websockets';
import { refOf, roomKey, type ConversationRecord } from '@cs/core';
import {
  ConnectQuerySchema,
  ConversationIdSchema,
  MAX_PAYLOAD_BYTES,
  MAX_TRANSPORT_BYTES,
  UserActionSchema,
  type ClientToServerEvents,
  type ServerToClientEvents,
  type UserActionAck,
} from '@cs/protocol';
import type { Server, Socket } from 'socket.io';
import type { AppConfig } from '@cs/config';
import { DevTokenHosts } from '../auth/dev-token-hosts.js';
import type { Principal } from '../auth/principal.js';
import { TokenService } from '../auth/token.service.js';
import { ConversationService } from '../conversations/conversation.service.js';
import { UserActionDelivery } from '../conversations/user-action-delivery.service.js';
import { mapError } from '../http/error-mapping.js';
import { assertJsonDepth, parseInput } from '../http/validation.js';
import { ServiceMetrics } from '@cs/observability';
import { APP_CONFIG } from '../tokens.js';
import { ConnectionLimiter } from './connection-limiter.js';
import { ConversationRoomHub } from './conversation-room-hub.js';
import { ConversationSockets, userRoomKey } from './conversation-sockets.js';
import {
  LiveConnection,
  REPLAY_LOW_WATER_BYTES,
  firstOf,
  logFieldsOf,
  type ConnectionTransport,
} from './live-connection.js';

/**
 * What a socket carries once its handshake was accepted: plain data, which
 * the adapter's `fetchSockets` hands to other gateways.
 */
interface ConversationSocketData {
  principal: Principal;
  conversation: ConversationRecord;
  latestEventId: number;
  start: boolean;
}

/** What only this process keeps of a socket. */
interface LocalSocketState {
  connection?: LiveConnection;
  /** Gives the user's connection place back (idempotent). */
  release?: () => void;
}

/** No server-side events between replicas: conversation traffic has its own channels. */
type NoInterServerEvents = Record<string, never>;
type ConversationServer = Server<
  ClientToServerEvents,
  ServerToClientEvents,
  NoInterServerEvents,
  ConversationSocketData
>;
type ConversationSocket = Socket<
  ClientToServerEvents,
  ServerToClientEvents,
  NoInterServerEvents,
  ConversationSocketData
>;

/** A handshake refusal: `connect_error` with `message` = code and `data` = { code, message }. */
class HandshakeError extends Error {
  constructor(readonly data: { code: string; message: string }) {
    super(data.code);
  }
}

/**
 * The Socket.IO door: one socket per client and conversation. The handshake
 * authenticates, takes one of the user's connection places and authorizes;
 * the connection (a `LiveConnection`) replays what the client missed and
 * streams what comes next, each event once and in order, until the client
 * leaves, its token expires or the conversation is deleted; `oh_user_action`
 * stores user actions with an acknowledgement. Cross-origin pages are let in
 * only from `CORS_ORIGINS` (see `ConfiguredIoAdapter`).
 */
@WebSocketGateway({
  path: '/socket.io',
  maxHttpBufferSize: MAX_TRANSPORT_BYTES,
  transports: ['websocket', 'polling'],
})
export class ConversationGateway
  implements OnGatewayInit, OnGatewayConnection, OnGatewayDisconnect
{
  private readonly logger = new Logger(ConversationGateway.name);

  @WebSocketServer()
  private server!: ConversationServer;
  private readonly local = new WeakMap<ConversationSocket, LocalSocketState>();

  constructor(
    private readonly tokens: TokenService,
    private readonly conversations: ConversationService,
    private readonly delivery: UserActionDelivery,
    private readonly hub: ConversationRoomHub,
    private readonly limiter: ConnectionLimiter,
    private readonly sockets: ConversationSockets,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    @Inject(APP_CONFIG) config: AppConfig,
  ) {
    this.devTokenHosts = tokens.devTokensEnabled
      ? new DevTokenHosts(config.http.corsOrigins)
      : null;
  }

  /** While development tokens are on, the hosts a handshake may name (DNS rebinding). */
  private readonly devTokenHosts: DevTokenHosts | null;

  afterInit(server: ConversationServer): void {
    this.sockets.serve(server);
    server.use((socket, next) => {
      this.authenticate(socket).then(
        () => next(),
        (error: unknown) => {
          this.local.get(socket)?.release?.();
          next(handshakeError(error));
        },
      );
    });
  }

  /** The Socket.IO server, once initialized. */
  get io(): ConversationServer {
    return this.server;
  }

  /** Closes every socket so that clients reconnect to another replica. */
  disconnectAll(): void {
    // `local`: with the Redis adapter, a plain disconnectSockets reaches every gateway.
    this.server?.local.disconnectSockets(true);
  }

  async handleConnection(socket: ConversationSocket): Promise<void> {
    const { conversation, latestEventId, start, principal } = socket.data;
    this.metrics.socketsConnected.inc();
    // The conversation's Socket.IO room: presence counts it, a delete closes it.
    void socket.join(roomKey(refOf(conversation)));
    // The user's room: an erasure closes every socket of the user.
    void socket.join(userRoomKey(principal.tenantId, principal.userId));
    socket.on('oh_user_action', (payload, ack) => {
      this.onUserAction(socket, payload).then(
        (response) => {
          if (typeof ack === 'function') ack(response);
        },
        (error: unknown) => this.logger.error(error),
      );
    });
    const connection = new LiveConnection({
      hub: this.hub,
      conversation,
      principal,
      afterId: latestEventId,
      read: (fromId, toId, limit) => this.conversations.readPage(conversation, fromId, toId, limit),
      transport: socketTransport(socket),
      endsOnDeletion: false,
      onEnd: (why) =>
        this.logger.log({ msg: `socket closed: ${why}`, ...logFieldsOf(conversation) }),
      onError: (error) =>
        this.logger.warn({ msg: `replay failed: ${String(error)}`, ...logFieldsOf(conversation) }),
    });
    this.localOf(socket).connection = connection;
    try {
      await this.delivery.attach(socket.id, conversation);
      // A client that left during the handshake must not stay counted.
      if (socket.disconnected) {
        connection.dispose();
        await this.delivery.detach(socket.id);
        return;
      }
      // The replay (once live traffic flows) and the start are independent:
      // the feed orders what the start brings.
      await Promise.all([
        connection.start(),
        start && socket.connected ? this.delivery.ensureRunning(conversation) : undefined,
      ]);
    } catch (error) {
      const { body } = mapError(error);
      this.logger.warn(
        `connection to ${conversation.id}: ${body.error.code} ${body.error.message}`,
      );
      socket.emit('oh_event', {
        status_update: true,
        type: 'error',
        id: body.error.code,
        message: body.error.message,
      });
    }
  }

  async handleDisconnect(socket: ConversationSocket): Promise<void> {
    const { connection, release } = this.localOf(socket);
    release?.();
    if (!connection) return;
    this.metrics.socketsConnected.dec();
    connection.dispose();
    await this.delivery
      .detach(socket.id)
      .catch((error: unknown) => this.logger.warn(String(error)));
  }

  private async authenticate(socket: ConversationSocket): Promise<void> {
    if (this.devTokenHosts && !this.devTokenHosts.allows(socket.handshake.headers.host)) {
      throw DevTokenHosts.refusal();
    }
    const auth = socket.handshake.auth as { token?: unknown } | undefined;
    const principal = await this.tokens.verify(auth?.token);
    // Not kept once verified: the adapter's `fetchSockets` hands a socket's
    // handshake to other gateways.
    socket.handshake.auth = {};
    const query = socket.handshake.query;
    const raw = query.conversation_id;
    if (raw === undefined || raw === '') {
      throw new HandshakeError({ code: 'BAD_REQUEST', message: 'conversation_id is required' });
    }
    if (!ConversationIdSchema.safeParse(raw).success) {
      throw new HandshakeError({ code: 'NOT_FOUND', message: 'conversation not found' });
    }
    const { conversation_id, latest_event_id, start } = parseInput(ConnectQuerySchema, {
      conversation_id: raw,
      latest_event_id: query.latest_event_id,
      start: query.start,
    });
    // The place is taken before any lookup, and given back however the socket ends.
    const release = this.limiter.acquire(principal);
    this.localOf(socket).release = release;
    socket.conn.once('close', release);
    const conversation = await this.conversations.find(principal, conversation_id);
    socket.data.principal = principal;
    socket.data.conversation = conversation;
    socket.data.latestEventId = latest_event_id;
    socket.data.start = start;
  }

  private localOf(socket: ConversationSocket): LocalSocketState {
    let state = this.local.get(socket);
    if (!state) {
      state = {};
      this.local.set(socket, state);
    }
    return state;
  }

  private async onUserAction(socket: ConversationSocket, payload: unknown): Promise<UserActionAck> {
    try {
      // Depth first: measuring a payload nested too deep would overflow the stack.
      assertJsonDepth(payload);
      if (payloadBytes(payload) > MAX_PAYLOAD_BYTES) {
        return failure('PAYLOAD_TOO_LARGE', 'a user action is at most 1 MiB');
      }
      const action = parseInput(UserActionSchema, payload);
      const { principal, conversation } = socket.data;
      // The append names the conversation's incarnation: one deleted since
      // (its id maybe taken again) is NOT_FOUND, never someone else's.
      const appended = await this.delivery.sendUserActionTo(principal, conversation, action);
      return { ok: true, event_id: appended.event.id };
    } catch (error) {
      const { body } = mapError(error);
      return { ok: false, error: body.error };
    }
  }
}

/**
 * A socket as a connection's transport. What waits unsent is counted from
 * the engine's packets since it last handed its buffer to the transport
 * (`drain`): a client that stops reading stops those hand-offs.
 */
function socketTransport(socket: ConversationSocket): ConnectionTransport {
  let unsent = 0;
  const engine = socket.conn;
  engine.on('packetCreate', (packet: { data?: unknown }) => {
    const data = packet.data;
    if (typeof data === 'string') unsent += data.length;
    else if (data instanceof Buffer) unsent += data.byteLength;
  });
  engine.on('drain', () => {
    unsent = 0;
  });
  return {
    send: (message) => socket.emit('oh_event', message),
    unsentBytes: () => unsent,
    drained: () =>
      unsent < REPLAY_LOW_WATER_BYTES || socket.disconnected
        ? Promise.resolve()
        : firstOf(engine, ['drain', 'close']),
    // Graceful or not, the engine sends what it has queued before it closes.
    close: () => socket.disconnect(true),
  };
}

function failure(code: string, message: string): UserActionAck {
  return { ok: false, error: { code, message } };
}

function payloadBytes(payload: unknown): number {
  try {
    return Buffer.byteLength(JSON.stringify(payload) ?? '');
  } catch {
    return Number.POSITIVE_INFINITY;
  }
}

function handshakeError(error: unknown): Error {
  if (error instanceof HandshakeError)
    return Object.assign(new Error(error.message), { data: error.data });
  const { body } = mapError(error);
  const { code, message, field } = body.error;
  const data = field === undefined ? { code, message } : { code, message, field };
  return Object.assign(new Error(data.code), { data });
}
