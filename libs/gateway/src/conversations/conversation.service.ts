import { Inject, Injectable, Optional } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import {
  BadRequestError,
  DomainError,
  refOf,
  roomKey,
  toConversationInfo,
  type EventPage,
  type ConversationBroadcaster,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
  type DataLifecycleStore,
  type DeletionEffects,
} from '@cs/core';
import {
  StatusId,
  type ConversationInfo,
  type ConversationPage,
  type ConversationPresence,
  type ConversationStateResponse,
  type ListConversationsQuery,
  type ListEventsQuery,
  type StoredEvent,
} from '@cs/protocol';
import { assertVisible, type Principal } from '../auth/principal.js';
import {
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  DATA_LIFECYCLE_STORE,
  ROOM_BROADCASTER,
} from '../tokens.js';
import { ConversationRoomHub } from '../realtime/conversation-room-hub.js';
import { ConversationSockets } from '../realtime/conversation-sockets.js';
import { ConversationExporter } from '../lifecycle/conversation-exporter.js';
import type { NdjsonSink } from '../lifecycle/ndjson-response.js';

/** docs/protocol.md: a page of events is at most 4 MiB (then `has_more`). */
const MAX_EVENT_PAGE_BYTES = 4 * 1024 * 1024;
/** A replay holds at most this much of a client's history in memory at once. */
const REPLAY_PAGE_BYTES = 1024 * 1024;

/**
 * What a caller may see of conversations, whichever door it came through (REST, Socket.IO, SSE):
 * records, event pages, state, presence and exports, by tenant and user; and their deletion.
 */
@Injectable()
export class ConversationService {
  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(CONVERSATION_STORE) private readonly store: ConversationStore,
    @Inject(DATA_LIFECYCLE_STORE) private readonly lifecycle: DataLifecycleStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    private readonly sockets: ConversationSockets,
    hub: ConversationRoomHub,
    @Optional() @Inject(ROOM_BROADCASTER) broadcaster: ConversationBroadcaster | null,
  ) {
    this.rooms = broadcaster ?? hub;
    this.exporter = new ConversationExporter(store, config.agent.multitaskStrategy);
  }

  private readonly exporter: ConversationExporter;

  /** Where SSE streams are told of a deletion: every gateway's (cluster) or this process's. */
  private readonly rooms: ConversationBroadcaster;

  /** The conversation if the caller may see it; `NOT_FOUND` otherwise. */
  async find(principal: Principal, conversationId: string): Promise<ConversationRecord> {
    const conversation = await this.store.getConversation(principal.tenantId, conversationId);
    assertVisible(principal, conversation);
    return conversation;
  }

  /** The API's view of a record (the deployment's strategy where it has none of its own). */
  info(record: ConversationRecord): ConversationInfo {
    return toConversationInfo(record, this.config.agent.multitaskStrategy);
  }

  async list(principal: Principal, query: ListConversationsQuery): Promise<ConversationPage> {
    const everyone = principal.isAdmin && query.all;
    const page = await this.store.listConversations(principal.tenantId, {
      userId: everyone ? undefined : principal.userId,
      limit: query.limit,
      cursor: query.page_id,
    });
    return {
      results: page.items.map((record) => this.info(record)),
      next_page_id: page.nextCursor,
    };
  }

  async get(principal: Principal, conversationId: string): Promise<ConversationInfo> {
    return this.info(await this.find(principal, conversationId));
  }

  /**
   * `DELETE /conversations/:id`. An admin's delete of another user's
   * conversation is audited, in the delete's transaction.
   */
  async delete(principal: Principal, conversationId: string): Promise<void> {
    const conversation = await this.find(principal, conversationId);
    const audit =
      conversation.userId === principal.userId
        ? undefined
        : {
            tenantId: principal.tenantId,
            actor: principal.userId,
            action: 'conversation.delete',
            target: `conversation:${conversationId}`,
          };
    await this.remove(refOf(conversation), audit ? { audit } : {});
  }

  /**
   * Stops and deletes the conversation (with what `effects` adds to the
   * delete's transaction), then closes every socket and stream of it, on
   * every gateway, after telling each why: sockets through the Socket.IO
   * adapter, SSE streams through the conversation's room (a reused id gets
   * another room, so none can stay behind). What `DELETE`, retention and an
   * erasure do; false when it was not deleted (gone already, another
   * incarnation, or a retention delete its user came back to).
   */
  async remove(ref: ConversationRef, effects: DeletionEffects = {}): Promise<boolean> {
    try {
      await this.manager.stop(ref);
    } catch (error) {
      // Deleted meanwhile: nothing to stop; the delete below finds nothing either.
      if (!(error instanceof DomainError && error.code === 'NOT_FOUND')) throw error;
    }
    const deleted = await this.lifecycle.deleteConversation(ref.tenantId, ref.conversationId, {
      incarnation: ref.incarnation,
      ...effects,
    });
    if (!deleted) return false;
    const room = roomKey(ref);
    const status = {
      status_update: true,
      type: 'error',
      id: StatusId.ConversationDeleted,
      message: 'the conversation was deleted',
    } as const;
    this.sockets.closeDeleted(room, status);
    this.rooms.publishStatus(room, status);
    return true;
  }

  /**
   * `GET /conversations/:id/export` into `sink` (see `ConversationExporter`).
   * An admin's export of another user's conversation is audited first.
   */
  async exportTo(
    principal: Principal,
    conversation: ConversationRecord,
    sink: NdjsonSink,
  ): Promise<number> {
    if (conversation.userId !== principal.userId) {
      await this.lifecycle.recordAudit(
        {
          tenantId: principal.tenantId,
          actor: principal.userId,
          action: 'conversation.export',
          target: `conversation:${conversation.id}`,
        },
        new Date(),
      );
    }
    return this.exporter.export(conversation.tenantId, conversation.id, sink);
  }

  /** The export of a conversation the caller was found to see (a user export's). */
  exportOne(tenantId: string, conversationId: string, sink: NdjsonSink): Promise<number> {
    return this.exporter.export(tenantId, conversationId, sink);
  }

  /** The sockets attached to the conversation on every gateway. */
  async presence(principal: Principal, conversationId: string): Promise<ConversationPresence> {
    const conversation = await this.find(principal, conversationId);
    return { sockets: await this.sockets.count(roomKey(refOf(conversation))) };
  }

  async events(
    principal: Principal,
    conversationId: string,
    query: ListEventsQuery,
  ): Promise<{ events: StoredEvent[]; has_more: boolean }> {
    await this.find(principal, conversationId);
    if (query.end_id !== undefined && query.end_id < query.start_id) {
      throw new BadRequestError('end_id must not be below start_id', 'end_id');
    }
    const page = await this.store.readEventPage(principal.tenantId, conversationId, {
      fromId: query.start_id,
      toId: query.end_id,
      reverse: query.reverse,
      limit: query.limit,
      maxBytes: MAX_EVENT_PAGE_BYTES,
    });
    return { events: page.events, has_more: page.hasMore };
  }

  /**
   * A page of stored events from `fromId`, for replays (no visibility check:
   * callers did it); nothing once the conversation is not this one any more.
   */
  readPage(
    conversation: ConversationRecord,
    fromId: number,
    toId: number | undefined,
    limit: number,
  ): Promise<EventPage> {
    return this.store.readEventPage(conversation.tenantId, conversation.id, {
      fromId,
      toId,
      limit,
      maxBytes: REPLAY_PAGE_BYTES,
      incarnation: conversation.incarnation,
    });
  }

  async state(principal: Principal, conversationId: string): Promise<ConversationStateResponse> {
    const record = await this.find(principal, conversationId);
    const snapshot = await this.store.getSnapshot(principal.tenantId, conversationId);
    assertVisible(principal, snapshot?.conversation ?? null);
    const { conversation, state } = snapshot!;
    const response: ConversationStateResponse = {
      agent_state: conversation.agentState,
      state,
      metrics: conversation.metrics,
      last_event_id: conversation.lastEventId,
    };
    if (principal.isAdmin) {
      const runtime = await this.manager.runtime(refOf(record));
      if (runtime)
        response.runtime = { worker_id: runtime.workerId, lease_epoch: runtime.leaseEpoch };
    }
    return response;
  }
}
