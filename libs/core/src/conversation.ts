import type {
  AgentState,
  ConversationInfo,
  ConversationMetrics,
  ConversationStatus,
  EventBody,
  EventSource,
  MultitaskStrategy,
} from '@cs/protocol';
import { DEFAULT_MULTITASK_STRATEGY } from '@cs/protocol';
import type { ModelUsageDelta } from './usage.js';

/** Who owns a conversation: every lookup is scoped by tenant. */
export interface ConversationRef {
  tenantId: string;
  userId: string;
  conversationId: string;
  /**
   * Which conversation of that id: an id may be used again after a delete.
   * Rooms, channels and appends name it (see `roomOf`).
   */
  incarnation: string;
}

/** A conversation's room: the live traffic of one incarnation of one id. */
export type RoomRef = Pick<ConversationRef, 'conversationId' | 'incarnation'>;

/** The key of a conversation's room, in every process and on Redis. */
export function roomKey(room: RoomRef): string {
  return `${room.conversationId}.${room.incarnation}`;
}

/** The conversation id of a room key (ids hold no `.`). */
export function conversationOfRoom(room: string): string {
  const dot = room.indexOf('.');
  return dot < 0 ? room : room.slice(0, dot);
}

/** The ref of a stored conversation (its owner's limits apply). */
export function refOf(record: ConversationRecord): ConversationRef {
  return {
    tenantId: record.tenantId,
    userId: record.userId,
    conversationId: record.id,
    incarnation: record.incarnation,
  };
}

/** A conversation row as the store returns it. */
export interface ConversationRecord {
  id: string;
  tenantId: string;
  userId: string;
  appName: string;
  title: string;
  metadata: Record<string, unknown>;
  agent: AgentSpec;
  instructions: string | null;
  status: ConversationStatus;
  agentState: AgentState | null;
  lastEventId: number;
  leaseEpoch: number;
  leaseOwner: string | null;
  incarnation: string;
  metrics: ConversationMetrics;
  /** Every user message up to this id has had its turn settled; -1 before any. */
  answeredThrough: number;
  /** What the turn its steps last counted has cost so far (see `countTurnCost`); null before any. */
  turnCost: TurnCost | null;
  settings: ConversationSettings;
  createdAt: Date;
  updatedAt: Date;
  /** Where a fork came from (see `ConversationStore.fork`); absent or null otherwise. */
  forkedFrom?: ForkOrigin | null;
}

/** The conversation a fork was made of, and the last event it copied. */
export interface ForkOrigin {
  conversationId: string;
  eventId: number;
}

/** The agent that runs a conversation: a registry name and its options. */
export interface AgentSpec {
  name: string;
  config: Record<string, unknown>;
}

/**
 * How a conversation's agent runs (docs/protocol.md "Agents"): chosen at
 * creation, some patchable.
 */
export interface ConversationSettings {
  confirmationMode: boolean;
  /** Null: the deployment's `MULTITASK_STRATEGY`. */
  multitaskStrategy: MultitaskStrategy | null;
  /** Lower limits than the deployment's, or null. */
  maxIterations: number | null;
  maxBudgetUsd: number | null;
}

/** The statuses of a live conversation: held by a process, or about to be. */
export const LIVE_STATUSES: readonly ConversationStatus[] = ['STARTING', 'RUNNING'];
/** The statuses a start moves from (to `STARTING`). */
export const STARTABLE_STATUSES: readonly ConversationStatus[] = ['STOPPED', 'ERROR'];

export function isLiveStatus(status: ConversationStatus): boolean {
  return LIVE_STATUSES.includes(status);
}

/** What a message sent while a turn runs does: the conversation's strategy, else the deployment's. */
export function effectiveMultitaskStrategy(
  settings: Pick<ConversationSettings, 'multitaskStrategy'>,
  deployment: MultitaskStrategy = DEFAULT_MULTITASK_STRATEGY,
): MultitaskStrategy {
  return settings.multitaskStrategy ?? deployment;
}

export const DEFAULT_SETTINGS: ConversationSettings = {
  confirmationMode: false,
  multitaskStrategy: null,
  maxIterations: null,
  maxBudgetUsd: null,
};

export interface NewConversation {
  id: string;
  tenantId: string;
  userId: string;
  appName: string;
  title: string;
  metadata: Record<string, unknown>;
  agent: AgentSpec;
  instructions: string | null;
  settings?: ConversationSettings;
}

export interface ConversationPatch {
  title?: string;
  metadata?: Record<string, unknown>;
  confirmationMode?: boolean;
  multitaskStrategy?: MultitaskStrategy;
  /** Counters added to the metrics: usage outside a turn's events (a title request). */
  addMetrics?: MetricsDelta;
  /** That usage, recorded in `model_usage` in the same write. */
  addUsage?: ModelUsageDelta;
}

/**
 * A change to the session state carried by an event. Keys prefixed `app:` go to
 * the app scope, `user:` to the user scope, `temp:` are never stored, plain
 * keys belong to the conversation. A `null` value deletes the key.
 */
export type StateDelta = Record<string, unknown>;

/** Counters added to the conversation's metrics with an event. */
export type MetricsDelta = Partial<ConversationMetrics>;

/** An event to append: its body and envelope, without the id the log assigns. */
export interface EventDraft {
  source: EventSource;
  body: EventBody;
  cause?: number;
  clientEventId?: string;
  stateDelta?: StateDelta;
  /** Added to the metrics; its `cost_usd` also to the cost of the turn of `cause` (`countTurnCost`). */
  metricsDelta?: MetricsDelta;
  /**
   * The user message whose turn this event settles: the conversation's
   * `answeredThrough` moves up to it (turns settle in id order).
   */
  answers?: number;
  /** The model usage of the step this event stores, recorded with it (see usage.ts). */
  usage?: ModelUsageDelta;
}

/**
 * The cost so far of one turn, kept on the conversation's row with the
 * events that spent it, so that `MAX_BUDGET_PER_TASK_USD` holds for a turn a
 * new holder resumes (failover, restart) instead of starting again from 0.
 */
export interface TurnCost {
  /** The turn's user message (its events' `cause`). */
  cause: number;
  costUsd: number;
}

/**
 * The turn cost once `draft` is stored: a draft with a `metricsDelta` (a
 * step's usage) adds its `cost_usd` to the turn of its `cause`; a turn not
 * counted yet starts afresh. Both stores apply it to every draft they store.
 */
export function countTurnCost(counted: TurnCost | null, draft: EventDraft): TurnCost | null {
  if (draft.metricsDelta === undefined || draft.cause === undefined) return counted;
  const cost = draft.metricsDelta.cost_usd ?? 0;
  return counted?.cause === draft.cause
    ? { cause: draft.cause, costUsd: counted.costUsd + cost }
    : { cause: draft.cause, costUsd: cost };
}

/** What the turn of `cause` has cost so far, as `counted` says (0 when it counts another). */
export function costSoFar(counted: TurnCost | null, cause: number): number {
  return counted?.cause === cause ? counted.costUsd : 0;
}

export const EMPTY_METRICS: ConversationMetrics = {
  iterations: 0,
  prompt_tokens: 0,
  completion_tokens: 0,
  cost_usd: 0,
};

/** The REST view of a conversation (docs/protocol.md `ConversationInfo`). */
export function toConversationInfo(
  record: ConversationRecord,
  defaultStrategy: MultitaskStrategy,
  status: ConversationStatus = record.status,
): ConversationInfo {
  return {
    conversation_id: record.id,
    title: record.title,
    created_at: record.createdAt.toISOString(),
    last_updated_at: record.updatedAt.toISOString(),
    status,
    agent_state: record.agentState,
    metadata: record.metadata,
    last_event_id: record.lastEventId,
    agent: record.agent.name,
    confirmation_mode: record.settings.confirmationMode,
    multitask_strategy: effectiveMultitaskStrategy(record.settings, defaultStrategy),
    parent_conversation_id: record.forkedFrom?.conversationId ?? null,
    forked_from_event_id: record.forkedFrom?.eventId ?? null,
  };
}
