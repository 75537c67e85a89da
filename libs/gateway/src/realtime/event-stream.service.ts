import { Inject, Injectable, Logger } from '@nestjs/common';
import { ServiceMetrics } from '@cs/observability';
import type { Request, Response } from 'express';
import type { ConversationRecord } from '@cs/core';
import type { ServerEvent } from '@cs/protocol';
import type { Principal } from '../auth/principal.js';
import { ConversationService } from '../conversations/conversation.service.js';
import { ConnectionLimiter } from './connection-limiter.js';
import { ConversationRoomHub } from './conversation-room-hub.js';
import { UserStreamRegistry } from './user-stream.registry.js';
import { LiveConnection, REPLAY_LOW_WATER_BYTES, firstOf, logFieldsOf } from './live-connection.js';

const HEARTBEAT_MS = 15_000;

/**
 * Server-Sent Events for a conversation: the same gap-free replay-then-live
 * `LiveConnection` as a socket, resumable with `Last-Event-ID`. It never
 * starts the agent.
 */
@Injectable()
export class EventStreamService {
  private readonly logger = new Logger(EventStreamService.name);
  private readonly open = new Set<Response>();

  constructor(
    private readonly conversations: ConversationService,
    private readonly hub: ConversationRoomHub,
    private readonly limiter: ConnectionLimiter,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    private readonly userStreams: UserStreamRegistry,
  ) {}

  /** Number of open streams. */
  get openCount(): number {
    return this.open.size;
  }

  async openStream(
    principal: Principal,
    conversation: ConversationRecord,
    afterId: number,
    _request: Request,
    response: Response,
  ): Promise<void> {
    // A client that left during authentication or the lookup is gone already:
    // its 'close' has fired, so nothing would ever release what it took.
    if (hasClosed(response)) return;
    const release = this.limiter.acquire(principal);
    response.status(200).set({
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    response.flushHeaders();
    const write = (event: ServerEvent) => {
      const id = 'id' in event && typeof event.id === 'number' ? `id: ${event.id}\n` : '';
      response.write(`${id}event: oh_event\ndata: ${JSON.stringify(event)}\n\n`);
    };
    const connection = new LiveConnection({
      hub: this.hub,
      conversation,
      principal,
      afterId,
      read: (fromId, toId, limit) => this.conversations.readPage(conversation, fromId, toId, limit),
      transport: {
        send: write,
        unsentBytes: () => response.writableLength,
        drained: () =>
          response.writableLength < REPLAY_LOW_WATER_BYTES || hasClosed(response)
            ? Promise.resolve()
            : firstOf(response, ['drain', 'close']),
        close: (graceful) => (graceful ? response.end() : response.destroy()),
      },
      onEnd: (why) =>
        this.logger.log({ msg: `stream closed: ${why}`, ...logFieldsOf(conversation) }),
      onError: (error) =>
        this.logger.warn({ msg: `stream failed: ${String(error)}`, ...logFieldsOf(conversation) }),
    });
    const heartbeat = setInterval(() => response.write(': keep-alive\n\n'), HEARTBEAT_MS);
    heartbeat.unref();
    this.open.add(response);
    this.metrics.eventStreamsOpen.inc();
    // An erasure of the user closes it, whatever conversation it follows.
    const forget = this.userStreams.add(principal.tenantId, principal.userId, (status) =>
      connection.sendStatus(status),
    );
    response.on('close', () => {
      this.metrics.eventStreamsOpen.dec();
      clearInterval(heartbeat);
      connection.dispose();
      release();
      forget();
      this.open.delete(response);
    });
    try {
      await connection.start();
    } catch (error) {
      this.logger.warn(`replay of ${conversation.id} failed: ${String(error)}`);
      response.end();
    }
  }

  /** Ends every open stream (shutdown): clients reconnect with Last-Event-ID. */
  closeAll(): void {
    for (const response of this.open) response.end();
    this.open.clear();
  }
}

/** True once the client's connection is gone (or the response was ended). */
function hasClosed(response: Response): boolean {
  return (
    response.closed ||
    response.destroyed ||
    response.writableEnded ||
    !response.socket ||
    response.socket.destroyed
  );
}
