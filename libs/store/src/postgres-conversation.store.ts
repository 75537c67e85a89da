/**
 * The `ConversationStore` on Postgres or PGlite: checks its arguments and
 * decides, and leaves the SQL to the repositories; appends go through
 * `EventAppender`, creation, fork and rewind each take one transaction.
 */
import type {
  UsageQuery,
  UsageReport,
  UsageScope,
  AppendOptions,
  AppendedEvent,
  ConversationPageRequest,
  ConversationPageResult,
  ConversationPatch,
  ConversationRecord,
  ConversationKey,
  ConversationRef,
  ConversationSnapshot,
  ConversationStore,
  EventDraft,
  EventPage,
  EventPageRange,
  EventRange,
  ForkRequest,
  LiveConversationPage,
  NewConversation,
  RewindRequest,
} from '@cs/core';
import { BadRequestError, NotFoundError, mergeScopes } from '@cs/core';
import type { ConversationStatus, StoredEvent } from '@cs/protocol';
import { CONVERSATION_STATUSES } from '@cs/protocol';
import { forkLocked, rewindLocked } from './branching.store.js';
import { createConversation } from './conversation-creation.store.js';
import { decodeCursor, encodeCursor, isUuid } from './conversation-page.cursor.js';
import type { SqlDatabase } from './database/sql-database.js';
import { EventAppender, type EventAppenderOptions } from './event-appender.js';
import { guardData } from './refused-text.js';
import { WriteClock } from './write-clock.js';
import { ConversationRepository } from './repositories/conversation.repository.js';
import { EventRepository } from './repositories/event.repository.js';
import { ScopedStateRepository } from './repositories/scoped-state.repository.js';
import { UsageRepository } from './repositories/usage.repository.js';

export interface ConversationStoreOptions extends EventAppenderOptions {
  /** The time of writes; see `WriteClock`. */
  clock?: WriteClock;
}

export class PostgresConversationStore implements ConversationStore {
  private readonly conversations: ConversationRepository;
  private readonly events: EventRepository;
  private readonly usage: UsageRepository;
  private readonly scopedStates: ScopedStateRepository;
  private readonly appender: EventAppender;
  private readonly clock: WriteClock;

  constructor(
    private readonly database: SqlDatabase,
    options: ConversationStoreOptions = {},
  ) {
    this.conversations = new ConversationRepository(database);
    this.events = new EventRepository(database);
    this.usage = new UsageRepository(database);
    this.scopedStates = new ScopedStateRepository(database);
    this.clock = options.clock ?? new WriteClock();
    this.appender = new EventAppender(database, this.clock, options);
  }

  createConversation(
    input: NewConversation,
    drafts: readonly EventDraft[] = [],
  ): Promise<{ conversation: ConversationRecord; created: boolean }> {
    return createConversation(this.database, this.clock, input, drafts);
  }

  async getConversation(
    tenantId: string,
    conversationId: string,
  ): Promise<ConversationRecord | null> {
    if (!isUuid(conversationId)) return null;
    return this.conversations.find(tenantId, conversationId);
  }

  async getSnapshot(
    tenantId: string,
    conversationId: string,
  ): Promise<ConversationSnapshot | null> {
    if (!isUuid(conversationId)) return null;
    const found = await this.conversations.findWithScopes(tenantId, conversationId);
    if (!found) return null;
    return { conversation: found.record, state: mergeScopes(found.scopes) };
  }

  async getScopedState(
    tenantId: string,
    appName: string,
    userId: string,
  ): Promise<Record<string, unknown>> {
    const scopes = await this.scopedStates.find(tenantId, appName, userId);
    return mergeScopes({ ...scopes, conversation: {} });
  }

  async listConversations(
    tenantId: string,
    page: ConversationPageRequest,
  ): Promise<ConversationPageResult> {
    if (!Number.isSafeInteger(page.limit) || page.limit < 1) {
      throw new BadRequestError('limit must be a positive integer', 'limit');
    }
    const after = page.cursor === undefined ? null : decodeCursor(page.cursor);
    // One row more than asked says whether another page exists.
    const rows = await this.conversations.listPage(
      tenantId,
      page.userId ?? null,
      after,
      page.limit + 1,
    );
    const items = rows.slice(0, page.limit);
    const last = items[items.length - 1];
    return {
      items: items.map((row) => row.record),
      nextCursor:
        rows.length > page.limit && last
          ? encodeCursor({ updatedAtMicros: last.updatedAtMicros, id: last.record.id })
          : null,
    };
  }

  async updateConversation(
    tenantId: string,
    conversationId: string,
    patch: ConversationPatch,
  ): Promise<ConversationRecord | null> {
    if (!isUuid(conversationId)) return null;
    if (Object.values(patch).every((value) => value === undefined)) {
      return this.conversations.find(tenantId, conversationId);
    }
    const at = this.clock.now();
    const usage = patch.addUsage;
    if (usage) {
      // A title request's usage: counted with the metrics it adds, in one transaction.
      return guardData(() =>
        this.database.transaction(async (tx) => {
          const record = await new ConversationRepository(tx).update(
            tenantId,
            conversationId,
            patch,
            at,
          );
          if (record) {
            await new UsageRepository(tx).add(
              tenantId,
              record.userId,
              conversationId,
              at.slice(0, 10),
              usage,
            );
          }
          return record;
        }),
      );
    }
    return guardData(() => this.conversations.update(tenantId, conversationId, patch, at));
  }

  async deleteConversation(tenantId: string, conversationId: string): Promise<boolean> {
    if (!isUuid(conversationId)) return false;
    return this.conversations.delete(tenantId, conversationId);
  }

  /** False when nothing changed: not found, or not in an `expected` status. */
  async setStatus(
    tenantId: string,
    conversationId: string,
    status: ConversationStatus,
    expected?: readonly ConversationStatus[],
  ): Promise<boolean> {
    for (const value of [status, ...(expected ?? [])]) {
      if (!CONVERSATION_STATUSES.includes(value)) {
        throw new BadRequestError(`invalid status ${String(value)}`, 'status');
      }
    }
    if (!isUuid(conversationId)) return false;
    return this.conversations.setStatus(tenantId, conversationId, status, expected ?? null);
  }

  resetRunningStatuses(): Promise<ConversationRef[]> {
    return this.conversations.resetRunningStatuses();
  }

  listLiveConversations(page: LiveConversationPage): Promise<ConversationRef[]> {
    // Conversation ids are UUIDs: nothing sorts after anything else here.
    if (page.afterId !== null && !isUuid(page.afterId)) return Promise.resolve([]);
    return this.conversations.listLive(page.idleBefore, page.afterId, page.limit);
  }

  async acquireLease(tenantId: string, conversationId: string, owner: string): Promise<number> {
    const epoch = isUuid(conversationId)
      ? await this.conversations.acquireLease(tenantId, conversationId, owner)
      : null;
    if (epoch === null) throw new NotFoundError();
    return epoch;
  }

  /** A lease taken over since (another owner or epoch) is left alone. */
  async releaseLease(
    tenantId: string,
    conversationId: string,
    owner: string,
    epoch: number,
  ): Promise<void> {
    if (!isUuid(conversationId)) return;
    await this.conversations.releaseLease(tenantId, conversationId, owner, epoch);
  }

  async findEventByClientEventId(
    tenantId: string,
    conversationId: string,
    clientEventId: string,
  ): Promise<StoredEvent | null> {
    if (!isUuid(conversationId)) return null;
    const found = await this.events.findByClientEventIds(tenantId, conversationId, [clientEventId]);
    return found.get(clientEventId)?.event ?? null;
  }

  /** See `EventAppender.append`. */
  async append(
    tenantId: string,
    conversationId: string,
    drafts: readonly EventDraft[],
    options: AppendOptions = {},
  ): Promise<AppendedEvent[]> {
    if (!isUuid(conversationId)) throw new NotFoundError();
    return this.appender.append(tenantId, conversationId, drafts, options);
  }

  async fork(
    tenantId: string,
    sourceId: string,
    request: ForkRequest,
  ): Promise<{ conversation: ConversationRecord; created: boolean }> {
    if (!isUuid(sourceId)) throw new NotFoundError();
    if (!isUuid(request.conversationId)) {
      throw new BadRequestError('conversation_id must be a UUID', 'conversation_id');
    }
    return guardData(() =>
      this.database.transaction((tx) => forkLocked(tx, tenantId, sourceId, request, this.clock)),
    );
  }

  async rewind(
    tenantId: string,
    conversationId: string,
    request: RewindRequest,
  ): Promise<AppendedEvent> {
    if (!isUuid(conversationId)) throw new NotFoundError();
    return guardData(() =>
      this.database.transaction((tx) =>
        rewindLocked(tx, tenantId, conversationId, request, this.clock),
      ),
    );
  }

  lastEventIds(refs: readonly ConversationKey[]): Promise<Map<string, number>> {
    const keys = refs.filter((ref) => isUuid(ref.conversationId));
    if (keys.length === 0) return Promise.resolve(new Map<string, number>());
    return this.conversations.lastEventIds(
      keys.map((ref) => ref.tenantId),
      keys.map((ref) => ref.conversationId),
    );
  }

  async readEventPage(
    tenantId: string,
    conversationId: string,
    range: EventPageRange,
  ): Promise<EventPage> {
    if (!Number.isSafeInteger(range.limit) || range.limit < 1) {
      throw new BadRequestError('limit must be a positive integer', 'limit');
    }
    if (!isUuid(conversationId)) return { events: [], hasMore: false };
    const fromId = Math.max(0, range.fromId ?? 0);
    const toId = range.toId ?? null;
    if (toId !== null && toId < fromId) return { events: [], hasMore: false };
    return this.events.readPage(tenantId, conversationId, {
      fromId,
      toId,
      reverse: range.reverse ?? false,
      limit: range.limit,
      maxBytes: range.maxBytes,
      incarnation: range.incarnation ?? null,
    });
  }

  async readEvents(
    tenantId: string,
    conversationId: string,
    range: EventRange,
  ): Promise<StoredEvent[]> {
    if (!Number.isSafeInteger(range.limit) || range.limit < 1) {
      throw new BadRequestError('limit must be a positive integer', 'limit');
    }
    if (!isUuid(conversationId)) return [];
    const fromId = Math.max(0, range.fromId ?? 0);
    const toId = range.toId ?? null;
    if (toId !== null && toId < fromId) return [];
    return this.events.readRange(
      tenantId,
      conversationId,
      fromId,
      toId,
      range.reverse ?? false,
      range.limit,
    );
  }

  usageReport(tenantId: string, query: UsageQuery): Promise<UsageReport> {
    return this.usage.report(tenantId, query);
  }

  usageCost(tenantId: string, scope: UsageScope): Promise<number> {
    return this.usage.cost(tenantId, scope);
  }
}
