import { Injectable, Logger } from '@nestjs/common';
import type { Request, Response } from 'express';
import type { ConversationRecord } from '@cs/core';
import type { ServerEvent } from '@cs/protocol';
import { ConversationService } from '../conversations/conversation.service.js';
import { ConversationRoomHub } from './conversation-room-hub.js';
import { OrderedEventFeed } from './ordered-event-feed.js';

const HEARTBEAT_MS = 15_000;

/**
 * Server-Sent Events for a conversation: the same gap-free replay-then-live
 * feed as a socket, resumable with `Last-Event-ID`. It never starts the agent.
 */
@Injectable()
export class EventStreamService {
  private readonly logger = new Logger(EventStreamService.name);
  private readonly open = new Set<Response>();

  constructor(
    private readonly conversations: ConversationService,
    private readonly hub: ConversationRoomHub,
  ) {}

  async openStream(
    conversation: ConversationRecord,
    afterId: number,
    request: Request,
    response: Response,
  ): Promise<void> {
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
    const feed = new OrderedEventFeed({
      afterId,
      read: (fromId, toId, limit) =>
        this.conversations.readAfter(conversation.tenantId, conversation.id, fromId, toId, limit),
      send: write,
      onError: (error) => this.logger.warn(`stream of ${conversation.id}: ${String(error)}`),
    });
    const { leave, ready } = this.hub.join(conversation.id, {
      offerEvents: (events) => feed.offer(events),
      resync: () => feed.resync(),
      sendStatus: write,
      sendStream: write,
    });
    const heartbeat = setInterval(() => response.write(': keep-alive\n\n'), HEARTBEAT_MS);
    heartbeat.unref();
    this.open.add(response);
    request.on('close', () => {
      clearInterval(heartbeat);
      feed.close();
      leave();
      this.open.delete(response);
    });
    try {
      await ready;
      await feed.start();
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
