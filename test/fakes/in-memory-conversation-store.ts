/**
 * A faithful in-memory `ConversationStore` for domain unit tests: gap-free
 * event ids from 0, idempotency by `clientEventId`, lease fencing, scoped
 * state, tenant scoping. The real store (Postgres / PGlite) lives in
 * `libs/store`; this double exists so that AgentSession and the managers can
 * be specified without a database. It passes the same contract
 * (test/integration/store.contract.ts), and validates drafts, ids and page
 * cursors with the real store's own code.
 */
import { randomUUID } from 'node:crypto';
import {
  AgentBusyError,
  BadRequestError,
  ConflictError,
  DEFAULT_SETTINGS,
  EMPTY_METRICS,
  LeaseLostError,
  NotFoundError,
  applyDelta,
  countTurnCost,
  effectiveMultitaskStrategy,
  isAgentBusy,
  isLiveStatus,
  mergeScopes,
  refOf,
  splitStateDelta,
  systemClock,
  type AppendOptions,
  type AppendedEvent,
  type Clock,
  type ConversationKey,
  type ConversationPageRequest,
  type ConversationPageResult,
  type ConversationPatch,
  type ConversationRecord,
  type ConversationRef,
  type ConversationSnapshot,
  type ConversationStore,
  type EventDraft,
  type EventPage,
  type EventPageRange,
  type EventRange,
  type LiveConversationPage,
  type NewConversation,
  EMPTY_USAGE,
  addUsage,
  utcDay,
  type ModelUsageDelta,
  type UsageQuery,
  type UsageReport,
  type UsageScope,
  type UsageTotals,
  type ForkRequest,
  type RewindRequest,
  forkAgentState,
  rewindDraft,
  undoneMarksOf,
  stateDeltaBetween,
  unfinishedCallResult,
} from '@cs/core';
import {
  CONVERSATION_STATUSES,
  isAction,
  isSameEvent,
  readAgentState,
  rewindTarget,
} from '@cs/protocol';
import type { ConversationStatus, StoredEvent } from '@cs/protocol';
// The store's own cursor codec and draft checks, not copies: plain code that
// loads no driver.
import {
  decodeCursor,
  encodeCursor,
  isUuid,
} from '../../libs/store/src/conversation-page.cursor.js';
import { prepareDraft } from '../../libs/store/src/event-append.plan.js';
import { WriteClock } from '../../libs/store/src/write-clock.js';

/** One usage row, keyed as the Postgres table is. */
interface UsageRow extends UsageTotals {
  tenantId: string;
  userId: string;
  day: string;
  model: string;
  conversationId: string;
}

interface StoredRow {
  event: StoredEvent;
  clientEventId: string | undefined;
  leaseEpoch: number | null;
  /** The conversation-scope part of the event's state delta (`events.state_delta`). */
  stateDelta: Record<string, unknown> | null;
}

interface ConversationEntry {
  record: ConversationRecord;
  /** Its activity time in microseconds, as the list's order and page cursors see it. */
  activityMicros: bigint;
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
  private readonly usage = new Map<string, UsageRow>();
  private readonly clock: Clock;
  /**
   * The real store's clock over `clock`: each reading later than the last, by
   * a microsecond when the clock has not moved on, so that activity orders
   * writes as Postgres does.
   */
  private readonly writeClock: WriteClock;
  /** Test hook run before each append (after nothing has been written). */
  beforeAppend: AppendHook | null = null;
  /**
   * Test hook run after each append has been written, before it returns: a
   * throw here is a commit whose answer was lost on its way back.
   */
  afterAppend: AppendHook | null = null;

  constructor(options: InMemoryConversationStoreOptions = {}) {
    this.clock = options.clock ?? systemClock;
    const clock = this.clock;
    this.writeClock = new WriteClock(() => clock.now());
  }

  async createConversation(
    given: NewConversation,
    drafts: readonly EventDraft[] = [],
  ): Promise<{ conversation: ConversationRecord; created: boolean }> {
    // Postgres keeps a uuid in lower case, whatever case it was written in.
    const input = { ...given, id: given.id.toLowerCase() };
    if (!isUuid(input.id)) {
      throw new BadRequestError('conversation_id must be a UUID', 'conversation_id');
    }
    drafts.forEach(prepareDraft);
    if (hasNul(input) || refusedInJson(input.metadata) || refusedInJson(input.agent)) {
      throw refusedText();
    }
    const existing = this.conversations.get(input.id);
    if (existing) {
      const owned =
        existing.record.tenantId === input.tenantId && existing.record.userId === input.userId;
      if (!owned) throw new ConflictError('conversation id already taken');
      return { conversation: clone(existing.record), created: false };
    }
    const activity = this.nextActivity();
    const now = activity.at;
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
    this.conversations.set(input.id, {
      record,
      activityMicros: activity.micros,
      state: {},
      events: [],
    });
    if (drafts.length > 0) {
      try {
        const appended = await this.append(input.tenantId, input.id, drafts);
        // A replayed history's rewinds keep their meaning.
        const rewinds = appended.flatMap(({ event }) => {
          const toEventId = rewindTarget(event);
          return toEventId === null ? [] : [{ id: event.id, toEventId }];
        });
        const { marks, invalid } = undoneMarksOf(rewinds);
        if (invalid !== null) {
          throw new BadRequestError(
            `the rewind ${invalid} goes back to no live event before it`,
            'to_event_id',
          );
        }
        for (const row of this.conversations.get(input.id)?.events ?? []) {
          const by = marks.get(row.event.id);
          if (by !== undefined) row.event.undone_by = by;
        }
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

  async listConversations(
    tenantId: string,
    page: ConversationPageRequest,
  ): Promise<ConversationPageResult> {
    checkLimit(page.limit);
    const after = page.cursor === undefined ? null : decodeCursor(page.cursor);
    const rows = [...this.conversations.values()]
      .map(positionOf)
      .filter(
        ({ record: r }) =>
          r.tenantId === tenantId && (page.userId === undefined || r.userId === page.userId),
      )
      .sort(compareActivityDesc)
      .filter((row) => after === null || compareActivityDesc(row, after) > 0);
    const items = rows.slice(0, page.limit);
    const last = items[items.length - 1];
    const nextCursor =
      rows.length > page.limit && last
        ? encodeCursor({ updatedAtMicros: last.updatedAtMicros, id: last.id })
        : null;
    return { items: items.map((row) => clone(row.record)), nextCursor };
  }

  async updateConversation(
    tenantId: string,
    conversationId: string,
    patch: ConversationPatch,
  ): Promise<ConversationRecord | null> {
    const entry = this.find(tenantId, conversationId);
    if (!entry) return null;
    if (Object.values(patch).every((value) => value === undefined)) return clone(entry.record);
    if (hasNul(patch.title) || refusedInJson(patch.metadata)) throw refusedText();
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
    if (patch.addUsage) this.recordUsage(entry.record, patch.addUsage);
    this.touch(entry);
    return clone(entry.record);
  }

  deleteConversation(tenantId: string, conversationId: string): Promise<boolean> {
    if (!this.find(tenantId, conversationId)) return Promise.resolve(false);
    this.conversations.delete(conversationId.toLowerCase());
    return Promise.resolve(true);
  }

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
    const entry = this.find(tenantId, conversationId);
    if (!entry || (expected && !expected.includes(entry.record.status))) return false;
    entry.record.status = status;
    return true;
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
          isLiveStatus(record.status) &&
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
    const prepared = drafts.map(prepareDraft);
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
    const activity = this.nextActivity();
    const timestamp = activity.at.toISOString();
    for (const { draft, payload } of prepared) {
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
        ...payload,
        ...(draft.cause === undefined ? {} : { cause: draft.cause }),
        ...(key !== undefined && isAction(draft.body) ? { client_event_id: key } : {}),
      } as StoredEvent;
      const { conversation: delta } = splitStateDelta(draft.stateDelta);
      fresh.push({
        event,
        clientEventId: key,
        leaseEpoch: epoch ?? null,
        stateDelta: Object.keys(delta).length === 0 ? null : clone(delta),
        draft,
      });
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
    // What Postgres refuses to store in JSON (refused-text.ts).
    if (fresh.some(({ event, draft }) => refusedInJson(event) || refusedInJson(draft.stateDelta))) {
      throw refusedText();
    }

    for (const { draft, ...row } of fresh) {
      entry.events.push(row);
      record.lastEventId = row.event.id;
      this.applyDraft(entry, draft);
    }
    if (fresh.length > 0) this.touch(entry, activity);
    if (this.afterAppend) await this.afterAppend(conversationId, drafts, options);
    return results;
  }

  async fork(
    tenantId: string,
    sourceId: string,
    request: ForkRequest,
  ): Promise<{ conversation: ConversationRecord; created: boolean }> {
    const source = this.find(tenantId, sourceId);
    if (!source) throw new NotFoundError();
    const last = source.record.lastEventId;
    const at = request.atEventId ?? last;
    if (request.atEventId !== undefined) assertPoint(request.atEventId, 'at_event_id', last);
    const existing = this.conversations.get(request.conversationId);
    if (existing) {
      const { record } = existing;
      if (
        record.tenantId === tenantId &&
        record.userId === request.userId &&
        record.forkedFrom?.conversationId === sourceId
      ) {
        return { conversation: clone(record), created: false };
      }
      throw new ConflictError('conversation_id is already taken');
    }
    const seen = source.events.filter((row) => row.event.id <= at && visibleAt(row, at));
    const lastState = [...seen]
      .reverse()
      .map((row) => (row.event.source === 'user' ? null : readAgentState(row.event)))
      .find((state) => state !== null);
    const activity = this.nextActivity();
    const now = activity.at;
    const record: ConversationRecord = {
      ...clone(source.record),
      id: request.conversationId,
      userId: request.userId,
      title: request.title ?? source.record.title,
      metadata: clone(request.metadata ?? source.record.metadata),
      status: 'STOPPED',
      agentState: forkAgentState(lastState ?? null) as ConversationRecord['agentState'],
      lastEventId: at,
      leaseOwner: null,
      incarnation: randomUUID(),
      answeredThrough: at,
      turnCost: null,
      metrics: { ...EMPTY_METRICS },
      createdAt: now,
      updatedAt: now,
      forkedFrom: { conversationId: sourceId, eventId: at },
    };
    const events = source.events
      .filter((row) => row.event.id <= at)
      .map((row) => {
        const copy = clone(row);
        if (copy.event.undone_by !== undefined && copy.event.undone_by > at) {
          delete copy.event.undone_by;
        }
        return copy;
      });
    const entry: ConversationEntry = {
      record,
      state: stateAt(events, at),
      events,
      activityMicros: activity.micros,
    };
    this.conversations.set(request.conversationId, entry);
    const open = callsWithoutResult(events, at);
    if (open.length > 0) {
      await this.append(
        tenantId,
        request.conversationId,
        open.map((call) => unfinishedCallResult(call, 'forked')),
      );
    }
    return { conversation: clone(entry.record), created: true };
  }

  async rewind(
    tenantId: string,
    conversationId: string,
    request: RewindRequest,
  ): Promise<AppendedEvent> {
    const entry = this.find(tenantId, conversationId);
    if (
      !entry ||
      (request.incarnation !== undefined && request.incarnation !== entry.record.incarnation)
    ) {
      throw new NotFoundError();
    }
    const key = request.clientEventId;
    const first =
      key === undefined ? undefined : entry.events.find((row) => row.clientEventId === key);
    if (first) {
      if (rewindTarget(first.event) !== request.toEventId) {
        throw new ConflictError(`client_event_id ${key} was already used for another event`);
      }
      return { event: clone(first.event), duplicate: true };
    }
    const { toEventId } = request;
    assertPoint(toEventId, 'to_event_id', entry.record.lastEventId, -1);
    if (entry.events.find((row) => row.event.id === toEventId)?.event.undone_by !== undefined) {
      throw new BadRequestError('to_event_id is an undone event', 'to_event_id');
    }
    const target = stateAt(entry.events, toEventId);
    const open = callsWithoutResult(
      entry.events.filter((row) => row.event.undone_by === undefined),
      toEventId,
    );
    const appended = await this.append(tenantId, conversationId, [
      rewindDraft(toEventId, stateDeltaBetween(entry.state, target), key),
      ...open.map((call) => unfinishedCallResult(call, 'rewound')),
    ]);
    const rewind = appended[0]!;
    for (const row of entry.events) {
      const { id } = row.event;
      if (id > toEventId && id < rewind.event.id && row.event.undone_by === undefined) {
        row.event.undone_by = rewind.event.id;
      }
    }
    entry.state = target;
    entry.record.answeredThrough = request.answerAgain
      ? toEventId - 1
      : appended[appended.length - 1]!.event.id;
    if (request.answerAgain) entry.record.turnCost = null;
    return rewind;
  }

  lastEventIds(refs: readonly ConversationKey[]): Promise<Map<string, number>> {
    const found = new Map<string, number>();
    for (const ref of refs) {
      const record = this.conversations.get(ref.conversationId.toLowerCase())?.record;
      if (record && record.tenantId === ref.tenantId) found.set(record.id, record.lastEventId);
    }
    return Promise.resolve(found);
  }

  async readEvents(
    tenantId: string,
    conversationId: string,
    range: EventRange,
  ): Promise<StoredEvent[]> {
    checkLimit(range.limit);
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
    checkLimit(range.limit);
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
    if (draft.usage) this.recordUsage(record, draft.usage);
    const agentState = readAgentState(draft.body);
    if (agentState !== null) record.agentState = agentState;
  }

  private nextActivity(): { at: Date; micros: bigint } {
    const iso = this.writeClock.now(); // YYYY-MM-DDTHH:MM:SS.ffffffZ
    const micros = BigInt(Date.parse(`${iso.slice(0, 19)}Z`)) * 1000n + BigInt(iso.slice(20, 26));
    return { at: new Date(Number(micros / 1000n)), micros };
  }

  /** Marks the conversation active now, or at `activity`. */
  private touch(entry: ConversationEntry, activity = this.nextActivity()): void {
    entry.record.updatedAt = activity.at;
    entry.activityMicros = activity.micros;
  }

  private recordUsage(record: ConversationRecord, usage: ModelUsageDelta): void {
    const { model, promptTokens, completionTokens, costUsd, requests } = usage;
    const key = {
      tenantId: record.tenantId,
      userId: record.userId,
      day: utcDay(this.clock.now()),
      model,
      conversationId: record.id,
    };
    const id = JSON.stringify(key);
    const row = this.usage.get(id) ?? { ...key, ...EMPTY_USAGE };
    this.usage.set(id, {
      ...row,
      ...addUsage(row, {
        prompt_tokens: promptTokens,
        completion_tokens: completionTokens,
        cost_usd: costUsd,
        requests,
      }),
    });
  }

  usageReport(tenantId: string, query: UsageQuery): Promise<UsageReport> {
    const groups = new Map<string, UsageTotals>();
    let total = EMPTY_USAGE;
    for (const row of this.usageRows(tenantId, query)) {
      const key = {
        day: row.day,
        user: row.userId,
        model: row.model,
        conversation: row.conversationId,
      }[query.groupBy];
      groups.set(key, addUsage(groups.get(key) ?? EMPTY_USAGE, row));
      total = addUsage(total, row);
    }
    const results = [...groups]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([key, totals]) => ({ key, ...totals }));
    return Promise.resolve({ results, total });
  }

  usageCost(tenantId: string, scope: UsageScope): Promise<number> {
    let cost = 0;
    for (const row of this.usageRows(tenantId, scope)) cost += row.cost_usd;
    return Promise.resolve(cost);
  }

  private usageRows(tenantId: string, scope: UsageScope): UsageRow[] {
    return [...this.usage.values()].filter(
      (row) =>
        row.tenantId === tenantId &&
        (scope.userId === undefined || row.userId === scope.userId) &&
        row.day >= scope.from &&
        row.day <= scope.to,
    );
  }

  private find(tenantId: string, conversationId: string): ConversationEntry | undefined {
    const entry = this.conversations.get(conversationId.toLowerCase());
    return entry && entry.record.tenantId === tenantId ? entry : undefined;
  }
}

/** A point that is not an event of the conversation is `BAD_REQUEST` naming the field. */
function assertPoint(value: number, field: string, lastEventId: number, lowest = 0): void {
  if (!Number.isSafeInteger(value) || value < lowest || value > lastEventId) {
    throw new BadRequestError(`${field} must be an event of the conversation`, field);
  }
}

/** Not undone as seen from `at`: undone by no rewind, or by one after `at`. */
function visibleAt(row: StoredRow, at: number): boolean {
  return row.event.undone_by === undefined || row.event.undone_by > at;
}

/** The conversation-scope state after `at`, folded from the stored deltas. */
function stateAt(rows: readonly StoredRow[], at: number): Record<string, unknown> {
  let state: Record<string, unknown> = {};
  for (const row of rows) {
    if (row.event.id > at || !visibleAt(row, at) || !row.stateDelta) continue;
    state = applyDelta(state, row.stateDelta);
  }
  return state;
}

/** Tool calls up to `at` without a result up to `at`, as seen from `at`. */
function callsWithoutResult(rows: readonly StoredRow[], at: number): StoredEvent[] {
  const seen = rows
    .filter((row) => row.event.id <= at && visibleAt(row, at))
    .map((row) => row.event);
  const answered = new Set(
    seen.flatMap((event) =>
      'observation' in event && event.observation === 'tool_result' && event.cause !== undefined
        ? [event.cause]
        : [],
    ),
  );
  return seen.filter(
    (event) =>
      event.source === 'agent' &&
      isAction(event) &&
      event.action === 'tool_call' &&
      !answered.has(event.id),
  );
}

function appKey(owner: Pick<ConversationRecord, 'tenantId' | 'appName'>): string {
  return JSON.stringify([owner.tenantId, owner.appName]);
}

function userKey(owner: Pick<ConversationRecord, 'tenantId' | 'appName' | 'userId'>): string {
  return JSON.stringify([owner.tenantId, owner.appName, owner.userId]);
}

/** A record with its activity time as a page cursor holds it: microseconds since 1970. */
interface ListRow {
  record: ConversationRecord;
  updatedAtMicros: string;
  id: string;
}

function positionOf(entry: ConversationEntry): ListRow {
  const { record } = entry;
  return { record, updatedAtMicros: String(entry.activityMicros), id: record.id };
}

/** Newest activity first, then the greater id first, as the stores' list query orders. */
function compareActivityDesc(
  a: Pick<ListRow, 'updatedAtMicros' | 'id'>,
  b: Pick<ListRow, 'updatedAtMicros' | 'id'>,
): number {
  const byTime = BigInt(b.updatedAtMicros) - BigInt(a.updatedAtMicros);
  if (byTime !== 0n) return byTime > 0n ? 1 : -1;
  return a.id < b.id ? 1 : a.id > b.id ? -1 : 0;
}

function checkLimit(limit: number): void {
  if (!Number.isSafeInteger(limit) || limit < 1) {
    throw new BadRequestError('limit must be a positive integer', 'limit');
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** What the Postgres store answers for text it cannot store (refused-text.ts). */
function refusedText(): BadRequestError {
  return new BadRequestError('text contains characters that cannot be stored');
}

/** A NUL character anywhere in a value, keys included: no Postgres text holds one. */
function hasNul(value: unknown): boolean {
  if (typeof value === 'string') return value.includes('\u0000');
  if (typeof value !== 'object' || value === null) return false;
  return Object.entries(value).some(([key, item]) => hasNul(key) || hasNul(item));
}

/** A NUL character or a lone surrogate anywhere in a JSON value, keys included. */
function refusedInJson(value: unknown): boolean {
  if (typeof value === 'string') return value.includes('\u0000') || LONE_SURROGATE.test(value);
  if (typeof value !== 'object' || value === null) return false;
  return Object.entries(value).some(([key, item]) => refusedInJson(key) || refusedInJson(item));
}

function clone<T>(value: T): T {
  return structuredClone(value);
}
