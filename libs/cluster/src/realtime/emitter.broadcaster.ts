import { Emitter } from '@socket.io/redis-emitter';
import type { ConversationBroadcaster } from '@cs/core';
import {
  InterServerEvent,
  type StatusUpdate,
  type StoredEvent,
  type StreamDelta,
} from '@cs/protocol';
import type { Redis } from 'ioredis';

/**
 * A worker's broadcaster: publishes through `@socket.io/redis-emitter` to the
 * gateways' adapter (same key), which hand the traffic to their room hubs.
 */
export class EmitterBroadcaster implements ConversationBroadcaster {
  private readonly emitter: Emitter;

  constructor(redis: Redis, key: string) {
    this.emitter = new Emitter(redis, { key });
  }

  publishEvents(conversationId: string, events: readonly StoredEvent[]): void {
    this.emitter.serverSideEmit(InterServerEvent.Events, conversationId, events);
  }

  publishStatus(conversationId: string, status: StatusUpdate): void {
    this.emitter.serverSideEmit(InterServerEvent.Status, conversationId, status);
  }

  publishStream(conversationId: string, delta: StreamDelta): void {
    this.emitter.serverSideEmit(InterServerEvent.Stream, conversationId, delta);
  }
}
