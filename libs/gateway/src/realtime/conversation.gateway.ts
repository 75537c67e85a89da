import { Inject, Logger } from '@nestjs/common';
import {
  WebSocketGateway,
  WebSocketServer,
  type OnGatewayConnection,
  type OnGatewayDisconnect,
  type OnGatewayInit,
} from '@nestjs/websockets';
import type { ConversationRecord } from '@cs/core';
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
import type { Principal } from '../auth/principal.js';
import { TokenService } from '../auth/token.service.js';
import { ConversationService } from '../conversations/conversation.service.js';
import { mapError } from '../http/error-mapping.js';
import { parseInput } from '../http/validation.js';
import { ServiceMetrics } from '@cs/observability';
import { ConversationRoomHub } from './conversation-room-hub.js';
import { OrderedEventFeed } from './ordered-event-feed.js';

/** What a socket carries once its handshake was accepted. */
interface ConversationSocketData {
  principal: Principal;
  conversation: ConversationRecord;
  latestEventId: number;
  start: boolean;
  feed?: OrderedEventFeed;
  leave?: () => void;
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

/** The room a conversation's sockets join (hash-tagged for Redis Cluster). */
export function conversationRoom(conversationId: string): string {
  return `conversation:{${conversationId}}`;
}

/**
 * The Socket.IO door: one socket per client and conversation. The handshake
 * authenticates and authorizes; the connection replays what the client missed
 * and streams what comes next, each event once and in order; `oh_user_action`
 * stores user actions with an acknowledgement.
 */
@WebSocketGateway({
  path: '/socket.io',
  maxHttpBufferSize: MAX_TRANSPORT_BYTES,
  cors: { origin: true },
  transports: ['websocket', 'polling'],
})
export class ConversationGateway
  implements OnGatewayInit, OnGatewayConnection, OnGatewayDisconnect
{
  private readonly logger = new Logger(ConversationGateway.name);

  @WebSocketServer()
  private server!: ConversationServer;

  constructor(
    private readonly tokens: TokenService,
    private readonly conversations: ConversationService,
    private readonly hub: ConversationRoomHub,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
  ) {}

  afterInit(server: ConversationServer): void {
    server.use((socket, next) => {
      this.authenticate(socket).then(
        () => next(),
        (error: unknown) => next(handshakeError(error)),
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
    const { conversation, latestEventId, start } = socket.data;
    this.metrics.socketsConnected.inc();
    socket.on('oh_user_action', (payload, ack) => {
      this.onUserAction(socket, payload).then(
        (response) => {
          if (typeof ack === 'function') ack(response);
        },
        (error: unknown) => this.logger.error(error),
      );
    });
    await socket.join(conversationRoom(conversation.id));
    const feed = new OrderedEventFeed({
      afterId: latestEventId,
      read: (fromId, toId, limit) =>
        this.conversations.readAfter(conversation.tenantId, conversation.id, fromId, toId, limit),
      send: (event) => socket.emit('oh_event', event),
      onError: (error) => this.logger.warn(`replay of ${conversation.id} failed: ${String(error)}`),
    });
    socket.data.feed = feed;
    const room = this.hub.join(conversation.id, {
      offerEvents: (events) => feed.offer(events),
      resync: () => feed.resync(),
      sendStatus: (status) => socket.emit('oh_event', status),
      sendStream: (delta) => socket.emit('oh_event', delta),
    });
    socket.data.leave = room.leave;
    try {
      await this.conversations.attach(socket.id, conversation);
      // A client that left during the handshake must not stay counted.
      if (socket.disconnected) {
        await this.conversations.detach(socket.id);
        return;
      }
      // The replay (once live traffic flows) and the start are independent:
      // the feed orders what the start brings.
      await Promise.all([
        room.ready.then(() => feed.start()),
        start && socket.connected ? this.conversations.ensureRunning(conversation) : undefined,
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
    if (!socket.data.conversation) return;
    this.metrics.socketsConnected.dec();
    socket.data.feed?.close();
    socket.data.leave?.();
    await this.conversations
      .detach(socket.id)
      .catch((error: unknown) => this.logger.warn(String(error)));
  }

  private async authenticate(socket: ConversationSocket): Promise<void> {
    const auth = socket.handshake.auth as { token?: unknown } | undefined;
    const principal = await this.tokens.verify(auth?.token);
    const query = socket.handshake.query;
    if (!ConversationIdSchema.safeParse(query.conversation_id).success) {
      throw new HandshakeError({ code: 'NOT_FOUND', message: 'conversation not found' });
    }
    const { conversation_id, latest_event_id, start } = parseInput(ConnectQuerySchema, {
      conversation_id: query.conversation_id,
      latest_event_id: query.latest_event_id,
      start: query.start,
    });
    const conversation = await this.conversations.find(principal, conversation_id);
    socket.data.principal = principal;
    socket.data.conversation = conversation;
    socket.data.latestEventId = latest_event_id;
    socket.data.start = start;
  }

  private async onUserAction(socket: ConversationSocket, payload: unknown): Promise<UserActionAck> {
    try {
      if (payloadBytes(payload) > MAX_PAYLOAD_BYTES) {
        return failure('PAYLOAD_TOO_LARGE', 'a user action is at most 1 MiB');
      }
      const action = parseInput(UserActionSchema, payload);
      const { principal, conversation } = socket.data;
      const appended = await this.conversations.sendUserActionTo(principal, conversation, action);
      return { ok: true, event_id: appended.event.id };
    } catch (error) {
      const { body } = mapError(error);
      return { ok: false, error: body.error };
    }
  }
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
  const data = { code: body.error.code, message: body.error.message };
  return Object.assign(new Error(data.code), { data });
}
