/**
 * The sockets of each conversation on every gateway, reached through the
 * Socket.IO adapter: each socket is in its conversation's Socket.IO room,
 * named as the service names the conversation's room (`roomKey`: its id and
 * incarnation, so that an id reused after a delete is another room). A
 * cluster gateway's adapter is the sharded Redis adapter (every gateway
 * answers); the standalone process's is Socket.IO's in-memory one. The
 * adapter also carries what one gateway tells the others of a user's SSE
 * streams (an erasure closes them all).
 */
import { Inject, Injectable, Optional } from '@nestjs/common';
import { UnavailableError } from '@cs/core';
import { StatusUpdateSchema, type StatusUpdate } from '@cs/protocol';
import { SOCKET_ADAPTER_CHECK } from '../tokens.js';
import { UserStreamRegistry } from './user-stream.registry.js';

/**
 * The longest a question to every gateway waits for the answers. A gateway
 * answers in about a millisecond; one that does not within this (hung, or
 * its Redis connection gone unnoticed) fails the question rather than hold
 * the request.
 */
export const CROSS_GATEWAY_TIMEOUT_MS = 2_000;

/** The message by which a gateway tells the others to close a user's SSE streams. */
export const CLOSE_USER_STREAMS = 'cs:close_user_streams';

/** The part of the Socket.IO server that rooms, and the other gateways, are reached through. */
export interface SocketRoomsServer {
  in(room: string): {
    timeout(ms: number): { fetchSockets(): Promise<readonly unknown[]> };
    emit(event: 'oh_event', message: StatusUpdate): unknown;
    disconnectSockets(close: boolean): void;
  };
  /** To every other gateway (`on` there): a cluster's adapter carries it. */
  serverSideEmit(
    event: typeof CLOSE_USER_STREAMS,
    tenantId: string,
    userId: string,
    status: StatusUpdate,
  ): unknown;
  on(
    event: typeof CLOSE_USER_STREAMS,
    listener: (tenantId: unknown, userId: unknown, status: unknown) => void,
  ): unknown;
}

@Injectable()
export class ConversationSockets {
  private server: SocketRoomsServer | null = null;

  constructor(
    @Optional()
    @Inject(SOCKET_ADAPTER_CHECK)
    private readonly assertReachable: (() => void) | null = null,
    private readonly streams: UserStreamRegistry = new UserStreamRegistry(),
  ) {}

  /**
   * Whether other gateways share the adapter: a cluster's, whose reach is
   * checked. The standalone process's in-memory adapter reaches only itself.
   */
  private get spansGateways(): boolean {
    return this.assertReachable !== null;
  }

  /** Called by the Socket.IO gateway once its server is up. */
  serve(server: SocketRoomsServer): void {
    this.server = server;
    server.on(CLOSE_USER_STREAMS, (tenantId, userId, status) => {
      const parsed = StatusUpdateSchema.safeParse(status);
      if (typeof tenantId !== 'string' || typeof userId !== 'string' || !parsed.success) return;
      this.streams.closeUser(tenantId, userId, parsed.data);
    });
  }

  /**
   * The sockets in the room on every gateway (the adapter's `fetchSockets`).
   * `UNAVAILABLE` at once while the adapter cannot reach the other gateways,
   * and when one of them does not answer within `timeoutMs`.
   */
  async count(room: string, timeoutMs = CROSS_GATEWAY_TIMEOUT_MS): Promise<number> {
    if (!this.server) throw new Error('Socket.IO is not serving yet');
    this.assertReachable?.();
    let timer: NodeJS.Timeout | undefined;
    // The adapter's own timeout starts only once it has counted the servers,
    // which is itself a round trip to Redis: this one bounds the whole question.
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(unanswered()), timeoutMs);
    });
    try {
      const sockets = await Promise.race([
        this.server.in(room).timeout(timeoutMs).fetchSockets(),
        deadline,
      ]);
      return sockets.length;
    } catch (error) {
      if (error instanceof Error && error.message.startsWith('timeout reached')) {
        throw unanswered();
      }
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Every socket of a deleted conversation, on every gateway, gets `status`
   * and is closed. Both go on the adapter's one channel (`static` mode), one
   * after the other, so that each gateway sends the status before it closes.
   */
  closeDeleted(room: string, status: StatusUpdate): void {
    this.server?.in(room).emit('oh_event', status);
    this.server?.in(room).disconnectSockets(true);
  }

  /**
   * Every socket of the user (`userRoomKey`) and every SSE stream
   * authenticated as the user, whatever conversation each follows, on every
   * gateway, gets `status` and is closed. The other gateways hear of the
   * streams on the adapter's channel, after the sockets' emit and close.
   */
  closeUser(tenantId: string, userId: string, status: StatusUpdate): void {
    this.closeDeleted(userRoomKey(tenantId, userId), status);
    this.streams.closeUser(tenantId, userId, status);
    if (this.spansGateways) {
      this.server?.serverSideEmit(CLOSE_USER_STREAMS, tenantId, userId, status);
    }
  }
}

/**
 * The Socket.IO room of every socket of one user (besides its conversation's):
 * how an erasure closes them all, on every gateway, whatever conversation
 * they are attached to. Conversation rooms are `<uuid>.<uuid>`: no clash.
 */
export function userRoomKey(tenantId: string, userId: string): string {
  return `user:${encodeURIComponent(tenantId)}/${encodeURIComponent(userId)}`;
}

function unanswered(): UnavailableError {
  return new UnavailableError('a gateway did not answer in time; try again shortly');
}
