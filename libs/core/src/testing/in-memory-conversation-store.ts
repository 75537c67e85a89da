/**
 * A faithful in-memory `ConversationStore` for domain unit tests: gap-free
 * event ids from 0, idempotency by `clientEventId`, lease fencing, scoped
 * state, tenant scoping. The real store (Postgres / PGlite) lives in
 * `libs/store`; this double exists so that AgentSession and the managers can
 * be specified without a database.
 */
import { isAction, isSameEvent, readAgentState, rewindTarget } from '@cs/protocol';
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
import {
  AgentBusyError,
  BadRequestError,
  ConflictError,
  LeaseLostError,
  NotFoundError,
} from '../errors.js';
import {
  forkAgentState,
  rewindDraft,
  stateDeltaBetween,
  unfinishedCallResult,
} from '../branching.js';
import { isAgentBusy } from '../agent-busy.js';
import { DEFAULT_SETTINGS, refOf } from '../conversation.js';
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
  ForkRequest,
  RewindRequest,
} from '../ports/conversation-store.port.js';
import { applyDelta, mergeScopes, splitStateDelta } from '../state.js';

interface StoredRow {
  event: StoredEvent;
  clientEventId: string | undefined;
  leaseEpoch: number | null;
  /** The conversation-scope part of the event's state delta (`events.state_delta`). */
  stateDelta: Record<string, unknown> | null;
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
    const strategy = record.settings.multitaskStrategy ?? options?.defaultMultitaskStrategy;
    const busy =
      options?.defaultMultitaskStrategy !== undefined &&
      strategy === 'reject' &&
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
    const now = new Date(this.clock.now());
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
    const entry: ConversationEntry = { record, state: stateAt(events, at), events };
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
