/**
 * The decisions of an append, kept apart from SQL so they can be tested alone:
 * validating drafts, telling idempotent repeats from conflicts, and folding
 * the new events' state deltas, metrics, turn cost and agent state into one
 * write each.
 */
import type { EventDraft, ModelUsageDelta, StateDelta, TurnCost } from '@cs/core';
import {
  BadRequestError,
  ConflictError,
  EMPTY_METRICS,
  countTurnCost,
  splitStateDelta,
} from '@cs/core';
import type { AgentState, ConversationMetrics, StoredEvent } from '@cs/protocol';
import {
  AGENT_STATE_CHANGED,
  ClientEventIdSchema,
  EVENT_ENVELOPE_KEYS,
  EventSourceSchema,
  eventType,
  isObservation,
  isSameEvent,
  MAX_AGENT_MESSAGE_CHARS,
  readAgentState,
} from '@cs/protocol';
import type { NewEventRow, TurnCostWrite } from './repositories/event-append.repository.js';
import type { StoredEventRow } from './repositories/event.repository.js';

/** A validated draft in the shape it is stored. */
export interface PreparedDraft {
  draft: EventDraft;
  source: StoredEvent['source'];
  type: string;
  /** The body as it reads back from jsonb: JSON round-tripped, envelope keys removed. */
  payload: Record<string, unknown>;
  /** `payload` as JSON text, serialized once. */
  payloadJson: string;
  /** Its size in UTF-8 bytes (stored, so that pages can be cut by bytes). */
  payloadBytes: number;
  cause: number | null;
  clientEventId: string | null;
  /** The agent state an `agent_state_changed` observation moves to. */
  agentState: AgentState | null;
}

/**
 * The largest event body the log takes. A user action is at most 1 MiB on
 * the wire; the largest is an agent's message, whose text (up to
 * `MAX_AGENT_MESSAGE_CHARS` UTF-16 units) is stored twice (`args.content` and
 * `message`), each unit at most 6 bytes as JSON (the `\u0001` escape of a
 * control character; 3 for any other), and a little room for the rest.
 */
export const MAX_EVENT_BYTES = 2 * 6 * MAX_AGENT_MESSAGE_CHARS + 64 * 1024;

export function prepareDraft(draft: EventDraft): PreparedDraft {
  if (!EventSourceSchema.safeParse(draft.source).success) {
    throw new BadRequestError('invalid event source', 'source');
  }
  const body = draft.body as unknown;
  if (typeof body !== 'object' || body === null) {
    throw new BadRequestError('an event needs a body', 'body');
  }
  const name: unknown =
    'action' in body ? body.action : 'observation' in body ? body.observation : undefined;
  if (typeof name !== 'string' || name === '') {
    throw new BadRequestError('an event is an action or an observation', 'body');
  }
  if (draft.cause !== undefined && !(Number.isSafeInteger(draft.cause) && draft.cause >= 0)) {
    throw new BadRequestError('cause must be an event id', 'cause');
  }
  if (
    draft.clientEventId !== undefined &&
    !ClientEventIdSchema.safeParse(draft.clientEventId).success
  ) {
    throw new BadRequestError('invalid client_event_id', 'client_event_id');
  }
  // A body carrying the envelope's keys would shadow the stored ones.
  const stripped: Record<string, unknown> = { ...draft.body };
  for (const key of EVENT_ENVELOPE_KEYS) delete stripped[key];
  const payloadJson = JSON.stringify(stripped);
  const payloadBytes = Buffer.byteLength(payloadJson);
  if (payloadBytes > MAX_EVENT_BYTES) {
    throw new BadRequestError(`an event is at most ${MAX_EVENT_BYTES} bytes as JSON`, 'body');
  }
  const payload = JSON.parse(payloadJson) as Record<string, unknown>;

  // Read as every reader reads it; a state change naming no known state is not stored.
  const agentState = readAgentState(draft.body);
  if (
    agentState === null &&
    isObservation(draft.body) &&
    draft.body.observation === AGENT_STATE_CHANGED
  ) {
    throw new BadRequestError('invalid agent_state', 'extras.agent_state');
  }
  return {
    draft,
    source: draft.source,
    type: eventType(draft.body),
    payload,
    payloadJson,
    payloadBytes,
    cause: draft.cause ?? null,
    clientEventId: draft.clientEventId ?? null,
    agentState,
  };
}

/** What became of one draft. */
export type AppendOutcome =
  { kind: 'stored'; event: StoredEvent } | { kind: 'new'; index: number; duplicate: boolean };

export interface AppendPlan {
  outcomes: AppendOutcome[];
  /** The events to write, ids assigned in draft order. */
  fresh: Array<NewEventRow & { prepared: PreparedDraft }>;
}

/**
 * Assigns ids from `nextId` to the drafts not already stored. A draft whose
 * `clientEventId` is stored (or repeats an earlier draft of the batch) with
 * the same source and body is a repeat; with anything else, a conflict.
 */
export function planAppend(
  drafts: readonly PreparedDraft[],
  stored: ReadonlyMap<string, StoredEventRow>,
  nextId: number,
): AppendPlan {
  const outcomes: AppendOutcome[] = [];
  const fresh: AppendPlan['fresh'] = [];
  const inBatch = new Map<string, number>();
  for (const prepared of drafts) {
    const key = prepared.clientEventId;
    if (key !== null) {
      const existing = stored.get(key);
      if (existing) {
        assertSameContent(key, existing, prepared);
        outcomes.push({ kind: 'stored', event: existing.event });
        continue;
      }
      const earlier = inBatch.get(key);
      if (earlier !== undefined) {
        const first = fresh[earlier]!;
        assertSameContent(key, first, prepared);
        outcomes.push({ kind: 'new', index: earlier, duplicate: true });
        continue;
      }
      inBatch.set(key, fresh.length);
    }
    outcomes.push({ kind: 'new', index: fresh.length, duplicate: false });
    fresh.push({
      id: nextId + fresh.length,
      source: prepared.source,
      type: prepared.type,
      payload: prepared.payload,
      cause: prepared.cause,
      client_event_id: key,
      prepared,
    });
  }
  return { outcomes, fresh };
}

function assertSameContent(
  key: string,
  stored: { source: string; payload: Record<string, unknown> },
  draft: PreparedDraft,
): void {
  if (
    !isSameEvent(
      { source: stored.source, body: stored.payload },
      { source: draft.source, body: draft.payload },
    )
  ) {
    throw new ConflictError(`client_event_id ${key} was already used for another event`);
  }
}

/**
 * The rows of `jsonb_to_recordset` as JSON text: each payload goes in as the
 * text serialized once by `prepareDraft`.
 */
export function eventRowsJson(
  rows: ReadonlyArray<NewEventRow & { prepared: PreparedDraft }>,
): string {
  const items = rows.map(
    (row) =>
      `{"id":${row.id},"source":${JSON.stringify(row.source)},"type":${JSON.stringify(row.type)},` +
      `"payload":${row.prepared.payloadJson},"size_bytes":${row.prepared.payloadBytes},` +
      `"cause":${row.cause ?? 'null'},` +
      `"client_event_id":${row.client_event_id === null ? 'null' : JSON.stringify(row.client_event_id)},` +
      `"state_delta":${conversationDeltaJson(row.prepared.draft)}}`,
  );
  return `[${items.join(',')}]`;
}

/**
 * The conversation-scope part of a draft's state delta as JSON text (a
 * deleted key as null), or `null`: stored on the event (`events.state_delta`)
 * so that the state after any event can be rebuilt (forks, rewinds).
 */
export function conversationDeltaJson(draft: EventDraft): string {
  const { conversation } = splitStateDelta(draft.stateDelta);
  return Object.keys(conversation).length === 0 ? 'null' : JSON.stringify(conversation);
}

/** One scope's share of the deltas: keys to set (JSON object text) and keys to delete. */
export interface ScopeWrite {
  set: string;
  deleted: string[];
  empty: boolean;
}

export interface FoldedDeltas {
  conversation: ScopeWrite;
  user: ScopeWrite;
  app: ScopeWrite;
  metrics: ConversationMetrics;
  /** The agent state of the last `agent_state_changed` among the events; null if none. */
  agentState: AgentState | null;
  /** The highest user message id whose turn one of the events settles; null if none. */
  answeredThrough: number | null;
  /** What the events add to the turn's cost; null if they count none. */
  turnCost: TurnCostWrite | null;
  /** The model usage the events carry, to record with them. */
  usage: ModelUsageDelta[];
}

/** Folds the deltas of the events in order: a later value of a key wins, `null` deletes. */
export function foldDeltas(drafts: readonly PreparedDraft[]): FoldedDeltas {
  const app: StateDelta = {};
  const user: StateDelta = {};
  const conversation: StateDelta = {};
  const metrics = { ...EMPTY_METRICS };
  let agentState: AgentState | null = null;
  let answeredThrough: number | null = null;
  let turnCost: TurnCost | null = null;
  let continues = true;
  const usage: ModelUsageDelta[] = [];
  for (const { draft, agentState: changedTo } of drafts) {
    if (draft.usage) usage.push(checkedUsage(draft.usage));
    if (draft.answers !== undefined) {
      if (!Number.isSafeInteger(draft.answers) || draft.answers < 0) {
        throw new BadRequestError('answers must be an event id', 'answers');
      }
      answeredThrough = Math.max(answeredThrough ?? -1, draft.answers);
    }
    const scoped = splitStateDelta(draft.stateDelta);
    Object.assign(app, scoped.app);
    Object.assign(user, scoped.user);
    Object.assign(conversation, scoped.conversation);
    for (const [name, value] of Object.entries(draft.metricsDelta ?? {})) {
      if (!(name in metrics)) continue;
      if (typeof value !== 'number' || !Number.isFinite(value)) {
        throw new BadRequestError(`metrics delta ${name} must be a finite number`, name);
      }
      metrics[name as keyof ConversationMetrics] += value;
    }
    const counted = countTurnCost(turnCost, draft);
    if (turnCost !== null && counted?.cause !== turnCost.cause) continues = false;
    turnCost = counted;
    if (changedTo !== null) agentState = changedTo;
  }
  return {
    conversation: toScopeWrite(conversation),
    user: toScopeWrite(user),
    app: toScopeWrite(app),
    metrics,
    agentState,
    answeredThrough,
    turnCost: turnCost && { ...turnCost, continues },
    usage,
  };
}

function checkedUsage(usage: ModelUsageDelta): ModelUsageDelta {
  for (const name of ['promptTokens', 'completionTokens', 'costUsd', 'requests'] as const) {
    const value = usage[name];
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
      throw new BadRequestError(`usage ${name} must be a finite number, not negative`, name);
    }
  }
  return usage;
}

function toScopeWrite(delta: StateDelta): ScopeWrite {
  const set: Record<string, unknown> = {};
  const deleted: string[] = [];
  for (const [key, value] of Object.entries(delta)) {
    if (value === null) deleted.push(key);
    else set[key] = value;
  }
  return { set: JSON.stringify(set), deleted, empty: Object.keys(delta).length === 0 };
}
