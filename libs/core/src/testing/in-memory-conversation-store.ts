/**
 * A faithful in-memory `ConversationStore` for domain unit tests: gap-free
 * event ids from 0, idempotency by `clientEventId`, lease fencing, scoped
 * state, tenant scoping. The real store (Postgres / PGlite) lives in
 * `libs/store`; this double exists so that AgentSession and the managers can
 * be specified without a database.
 */
import { isAction, isSameEvent, readAgentState } from '@cs/protocol';
import type { ConversationStatus, StoredEvent } from '@cs/protocol';
import {
  EMPTY_METRICS,
  countTurnCost,
  type ConversationPatch,
  type ConversationRecord,
  type ConversationRef,
  type EventDraft,
  type NewConversation,
} from '../conversation.js';
import { AgentBusyError, ConflictError, LeaseLostError, NotFoundError } from '../errors.js';
import { isAgentBusy } from '../agent-busy.js';
import { DEFAULT_SETTINGS, effectiveMultitaskStrategy, refOf } from '../conversation.js';
import { randomUUID } from 'node:crypto';
import { systemClock, type Clock } from '../ports/clock.port.js';
import type {
  ConversationKey,
  AppendOptions,
  AppendedEvent,
  ConversationPageRequest,
  ConversationPageResult,
  ConversationSnapshot,
  ConversationStore,
  EventPage,
  EventPageRange,
  EventRange,
  LiveConversationPage,
} from '../ports/conversation-store.port.js';
import { applyDelta, mergeScopes, splitStateDelta } from '../state.js';

interface StoredRow {
  event: StoredEvent;
  clientEventId: string | undefined;
  leaseEpoch: number | null;
}

interface ConversationEntry {
  record: ConversationRecord;
  state: Record<string, unknown>;
  events: StoredRow[];
}

/** Called before every append; throw from it to simulate a failed write. */
export type AppendHook = (
  conversationId: string,
  drafts: readonly EventDraft[],
  options: AppendOptions | undefined,
) => void | Promise<void>;

export interface InMemoryConversationStoreOptions {
  clock?: Clock;
}

export class InMemoryConversationStore implements ConversationStore {
  private readonly conversations = new Map<string, ConversationEntry>();
  private readonly appStates = new Map<string, Record<string, unknown>>();
  private readonly userStates = new Map<string, Record<string, unknown>>();
  private readonly clock: Clock;
  /** Test hook run before each append (after nothing has been written). */
  beforeAppend: AppendHook | null = null;
  /**
   * Test hook run after each append has been written, before it returns: a
   * throw here is a commit whose answer was lost on its way back.
   */
  afterAppend: AppendHook | null = null;

  constructor(options: InMemoryConversationStoreOptions = {}) {
    this.clock = options.clock ?? systemClock;
  }

  async createConversation(
    input: NewConversation,
    drafts: readonly EventDraft[] = [],
  ): Promise<{ conversation: ConversationRecord; created: boolean }> {
    const existing = this.conversations.get(input.id);
    if (existing) {
      const owned =
        existing.record.tenantId === input.tenantId && existing.record.userId === input.userId;
      if (!owned) throw new ConflictError('conversation id already taken');
      return { conversation: clone(existing.record), created: false };
    }
    const now = new Date(this.clock.now());
    const record: ConversationRecord = {
      ...clone(input),
      status: 'STOPPED',
      agentState: null,
      lastEventId: -1,
      leaseEpoch: 0,
      leaseOwner: null,
      incarnation: randomUUID(),
      answeredThrough: -1,
      turnCost: null,
      settings: { ...DEFAULT_SETTINGS, ...input.settings },
      metrics: { ...EMPTY_METRICS },
      createdAt: now,
      updatedAt: now,
    };
    this.conversations.set(input.id, { record, state: {}, events: [] });
    if (drafts.length > 0) {
      try {
        await this.append(input.tenantId, input.id, drafts);
      } catch (error) {
        this.conversations.delete(input.id); // all of it or none
        throw error;
      }
    }
    return { conversation: clone(record), created: true };
  }

  getConversation(tenantId: string, conversationId: string): Promise<ConversationRecord | null> {
    const entry = this.find(tenantId, conversationId);
    return Promise.resolve(entry ? clone(entry.record) : null);
  }

  getSnapshot(tenantId: string, conversationId: string): Promise<ConversationSnapshot | null> {
    const entry = this.find(tenantId, conversationId);
    if (!entry) return Promise.resolve(null);
    const { record } = entry;
    const state = mergeScopes({
      app: this.appStates.get(appKey(record)) ?? {},
      user: this.userStates.get(userKey(record)) ?? {},
      conversation: entry.state,
    });
    return Promise.resolve({ conversation: clone(record), state: clone(state) });
  }

  getScopedState(
    tenantId: string,
    appName: string,
    userId: string,
  ): Promise<Record<string, unknown>> {
    const owner = { tenantId, appName, userId };
    const state = mergeScopes({
      app: this.appStates.get(appKey(owner)) ?? {},
      user: this.userStates.get(userKey(owner)) ?? {},
      conversation: {},
    });
    return Promise.resolve(clone(state));
  }

  listConversations(
    tenantId: string,
    page: ConversationPageRequest,
  ): Promise<ConversationPageResult> {
    const after = page.cursor === undefined ? null : decodeCursor(page.cursor);
    const rows = [...this.conversations.values()]
      .map((entry) => entry.record)
      .filter(
        (r) => r.tenantId === tenantId && (page.userId === undefined || r.userId === page.userId),
      )
      .sort(compareActivityDesc)
      .filter((r) => after === null || compareActivityDesc(r, after) > 0);
    const items = rows.slice(0, page.limit);
    const last = items[items.length - 1];
    const nextCursor =
      rows.length > page.limit && last ? encodeCursor(last.updatedAt.getTime(), last.id) : null;
    return Promise.resolve({ items: items.map(clone), nextCursor });
  }

  updateConversation(
    tenantId: string,
    conversationId: string,
    patch: ConversationPatch,
  ): Promise<ConversationRecord | null> {
    const entry = this.find(tenantId, conversationId);
    if (!entry) return Promise.resolve(null);
    if (patch.title !== undefined) entry.record.title = patch.title;
    if (patch.metadata !== undefined) entry.record.metadata = clone(patch.metadata);
    if (patch.confirmationMode !== undefined)
      entry.record.settings.confirmationMode = patch.confirmationMode;
    if (patch.multitaskStrategy !== undefined)
      entry.record.settings.multitaskStrategy = patch.multitaskStrategy;
    for (const [name, value] of Object.entries(patch.addMetrics ?? {})) {
      const metric = name as keyof typeof entry.record.metrics;
      if (typeof value === 'number') entry.record.metrics[metric] += value;
    }
    entry.record.updatedAt = new Date(this.clock.now());
    return Promise.resolve(clone(entry.record));
  }

  deleteConversation(tenantId: string, conversationId: string): Promise<boolean> {
    if (!this.find(tenantId, conversationId)) return Promise.resolve(false);
    this.conversations.delete(conversationId);
    return Promise.resolve(true);
  }

  setStatus(
    tenantId: string,
    conversationId: string,
    status: ConversationStatus,
    expected?: readonly ConversationStatus[],
  ): Promise<boolean> {
    const entry = this.find(tenantId, conversationId);
    if (!entry || (expected && !expected.includes(entry.record.status)))
      return Promise.resolve(false);
    entry.record.status = status;
    return Promise.resolve(true);
  }

  releaseLease(
    tenantId: string,
    conversationId: string,
    owner: string,
    epoch: number,
  ): Promise<void> {
    const entry = this.find(tenantId, conversationId);
    if (entry && entry.record.leaseOwner === owner && entry.record.leaseEpoch === epoch) {
      entry.record.leaseOwner = null;
    }
    return Promise.resolve();
  }

  findEventByClientEventId(
    tenantId: string,
    conversationId: string,
    clientEventId: string,
  ): Promise<StoredEvent | null> {
    const entry = this.find(tenantId, conversationId);
    const row = entry?.events.find((candidate) => candidate.clientEventId === clientEventId);
    return Promise.resolve(row ? row.event : null);
  }

  resetRunningStatuses(): Promise<ConversationRef[]> {
    const reset: ConversationRef[] = [];
    for (const { record } of this.conversations.values()) {
      if (record.status === 'STARTING' || record.status === 'RUNNING') {
        record.status = 'STOPPED';
        reset.push(refOf(record));
      }
    }
    return Promise.resolve(reset);
  }

  listLiveConversations(page: LiveConversationPage): Promise<ConversationRef[]> {
    const live = [...this.conversations.values()]
      .map(({ record }) => record)
      .filter(
        (record) =>
          (record.status === 'STARTING' || record.status === 'RUNNING') &&
          record.updatedAt < page.idleBefore &&
          (page.afterId === null || record.id > page.afterId),
      )
      .sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    return Promise.resolve(live.slice(0, page.limit).map(refOf));
  }

  acquireLease(tenantId: string, conversationId: string, owner: string): Promise<number> {
    const entry = this.find(tenantId, conversationId);
    if (!entry) return Promise.reject(new NotFoundError());
    entry.record.leaseEpoch += 1;
    entry.record.leaseOwner = owner;
    return Promise.resolve(entry.record.leaseEpoch);
  }

  async append(
    tenantId: string,
    conversationId: string,
    drafts: readonly EventDraft[],
    options?: AppendOptions,
  ): Promise<AppendedEvent[]> {
    if (this.beforeAppend) await this.beforeAppend(conversationId, drafts, options);
    const entry = this.find(tenantId, conversationId);
    if (!entry) throw new NotFoundError();
    if (options?.incarnation !== undefined && options.incarnation !== entry.record.incarnation) {
      throw new NotFoundError();
    }
    const { record } = entry;
    const epoch = options?.leaseEpoch;
    if (epoch !== undefined && epoch !== record.leaseEpoch) {
      throw new LeaseLostError(conversationId, epoch, record.leaseEpoch);
    }

    // Decide everything first, then commit: an append is all or nothing.
    const results: AppendedEvent[] = [];
    const fresh: (StoredRow & { draft: EventDraft })[] = [];
    const timestamp = new Date(this.clock.now()).toISOString();
    for (const draft of drafts) {
      const key = draft.clientEventId;
      const previous =
        key === undefined
          ? undefined
          : [...entry.events, ...fresh].find((row) => row.clientEventId === key);
      if (previous) {
        if (!isSameEvent({ source: previous.event.source, body: previous.event }, draft)) {
          throw new ConflictError('client_event_id already used with other content');
        }
        results.push({ event: clone(previous.event), duplicate: true });
        continue;
      }
      const id = record.lastEventId + 1 + fresh.length;
      const event = {
        id,
        timestamp,
        source: draft.source,
        ...clone(draft.body),
        ...(draft.cause === undefined ? {} : { cause: draft.cause }),
        ...(key !== undefined && isAction(draft.body) ? { client_event_id: key } : {}),
      } as StoredEvent;
      fresh.push({ event, clientEventId: key, leaseEpoch: epoch ?? null, draft });
      results.push({ event: clone(event), duplicate: false });
    }
    const busy =
      options?.defaultMultitaskStrategy !== undefined &&
      effectiveMultitaskStrategy(record.settings, options.defaultMultitaskStrategy) === 'reject' &&
      fresh.length > 0 &&
      isAgentBusy({
        agentState: record.agentState,
        unansweredMessages: () =>
          entry.events.filter(
            ({ event }) =>
              event.id > record.answeredThrough &&
              event.source === 'user' &&
              isAction(event) &&
              event.action === 'message',
          ).length,
      });
    if (busy) throw new AgentBusyError();

    for (const { draft, ...row } of fresh) {
      entry.events.push(row);
      record.lastEventId = row.event.id;
      this.applyDraft(entry, draft);
    }
    if (fresh.length > 0) record.updatedAt = new Date(this.clock.now());
    if (this.afterAppend) await this.afterAppend(conversationId, drafts, options);
    return results;
  }

  lastEventIds(refs: readonly ConversationKey[]): Promise<Map<string, number>> {
    const found = new Map<string, number>();
    for (const ref of refs) {
      const record = this.conversations.get(ref.conversationId)?.record;
      if (record && record.tenantId === ref.tenantId) found.set(record.id, record.lastEventId);
    }
    return Promise.resolve(found);
  }

  readEvents(tenantId: string, conversationId: string, range: EventRange): Promise<StoredEvent[]> {
    const entry = this.find(tenantId, conversationId);
    if (!entry) return Promise.resolve([]);
    const from = range.fromId ?? 0;
    const to = range.toId ?? entry.record.lastEventId;
    let rows = entry.events.filter((row) => row.event.id >= from && row.event.id <= to);
    if (range.reverse) rows = rows.reverse();
    return Promise.resolve(rows.slice(0, range.limit).map((row) => clone(row.event)));
  }

  async readEventPage(
    tenantId: string,
    conversationId: string,
    range: EventPageRange,
  ): Promise<EventPage> {
    const entry = this.find(tenantId, conversationId);
    if (
      !entry ||
      (range.incarnation !== undefined && range.incarnation !== entry.record.incarnation)
    )
      return { events: [], hasMore: false };
    const candidates = await this.readEvents(tenantId, conversationId, {
      ...range,
      limit: range.limit + 1,
    });
    const events: StoredEvent[] = [];
    let bytes = 0;
    for (const event of candidates) {
      const {
        id: _id,
        timestamp: _t,
        source: _s,
        cause: _c,
        client_event_id: _k,
        ...body
      } = event as StoredEvent & { client_event_id?: string };
      bytes += Buffer.byteLength(JSON.stringify(body));
      if (events.length === range.limit || (events.length > 0 && bytes > range.maxBytes)) break;
      events.push(event);
    }
    return { events, hasMore: events.length < candidates.length };
  }

  // ------------------------------------------------------------ test helpers

  /** The lease epoch each event was written under (null for user events), by id. */
  leaseEpochs(conversationId: string): (number | null)[] {
    return (this.conversations.get(conversationId)?.events ?? []).map((row) => row.leaseEpoch);
  }

  /** Every stored event of a conversation, ignoring tenancy. */
  allEvents(conversationId: string): StoredEvent[] {
    return (this.conversations.get(conversationId)?.events ?? []).map((row) => clone(row.event));
  }

  private applyDraft(entry: ConversationEntry, draft: EventDraft): void {
    const { record } = entry;
    const scoped = splitStateDelta(draft.stateDelta);
    entry.state = applyDelta(entry.state, scoped.conversation);
    this.appStates.set(
      appKey(record),
      applyDelta(this.appStates.get(appKey(record)) ?? {}, scoped.app),
    );
    this.userStates.set(
      userKey(record),
      applyDelta(this.userStates.get(userKey(record)) ?? {}, scoped.user),
    );
    if (draft.answers !== undefined) {
      record.answeredThrough = Math.max(record.answeredThrough, draft.answers);
    }
    for (const [name, value] of Object.entries(draft.metricsDelta ?? {})) {
      const metric = name as keyof typeof record.metrics;
      if (typeof value === 'number') record.metrics[metric] += value;
    }
    record.turnCost = countTurnCost(record.turnCost, draft);
    const agentState = readAgentState(draft.body);
    if (agentState !== null) record.agentState = agentState;
  }

  private find(tenantId: string, conversationId: string): ConversationEntry | undefined {
    const entry = this.conversations.get(conversationId);
    return entry && entry.record.tenantId === tenantId ? entry : undefined;
  }
}

function appKey(owner: Pick<ConversationRecord, 'tenantId' | 'appName'>): string {
  return JSON.stringify([owner.tenantId, owner.appName]);
}

function userKey(owner: Pick<ConversationRecord, 'tenantId' | 'appName' | 'userId'>): string {
  return JSON.stringify([owner.tenantId, owner.appName, owner.userId]);
}

function compareActivityDesc(
  a: Pick<ConversationRecord, 'updatedAt' | 'id'>,
  b: Pick<ConversationRecord, 'updatedAt' | 'id'>,
): number {
  const byTime = b.updatedAt.getTime() - a.updatedAt.getTime();
  if (byTime !== 0) return byTime;
  return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
}

function encodeCursor(updatedAtMs: number, id: string): string {
  return Buffer.from(JSON.stringify([updatedAtMs, id])).toString('base64url');
}

function decodeCursor(cursor: string): Pick<ConversationRecord, 'updatedAt' | 'id'> {
  const [ms, id] = JSON.parse(Buffer.from(cursor, 'base64url').toString()) as [number, string];
  return { updatedAt: new Date(ms), id };
}

function clone<T>(value: T): T {
  return structuredClone(value);
}
