import type { ConversationStatus, MultitaskStrategy, StoredEvent } from '@cs/protocol';
import type { UsageQuery, UsageReport, UsageScope } from '../usage.js';
import type {
  ConversationPatch,
  ConversationRef,
  ConversationRecord,
  EventDraft,
  NewConversation,
} from '../conversation.js';

/** A conversation's key: every read filters by tenant. */
export type ConversationKey = Pick<ConversationRef, 'tenantId' | 'conversationId'>;

/** A page of `listLiveConversations`. */
export interface LiveConversationPage {
  idleBefore: Date;
  /** Only conversations whose id sorts after this one (null: from the first). */
  afterId: string | null;
  limit: number;
}

export interface AppendOptions {
  /**
   * The writer's lease epoch. When given, the append fails with
   * `LeaseLostError` (and writes nothing) unless it equals the conversation's
   * current `lease_epoch`; it is stored on every event written.
   */
  leaseEpoch?: number;
  /**
   * The incarnation the writer knows. When given, the append fails with
   * `NotFoundError` (and writes nothing) unless the conversation of that id
   * is still this one: a deleted conversation's writers never reach the one
   * that reuses its id.
   */
  incarnation?: string;
  /**
   * Given for a user message: the deployment's `MULTITASK_STRATEGY`. When the
   * conversation's own `multitask_strategy` (this one when it has none) is
   * `reject`, the append fails with `AgentBusyError`, and writes nothing,
   * while the agent works (see `isAgentBusy`). Both are read under the
   * conversation's row lock: of messages sent at the same moment one is taken
   * and the others refused, and a PATCH of the strategy applies from the next
   * message on, whoever sends it (a socket's record is as old as its
   * handshake).
   */
  defaultMultitaskStrategy?: MultitaskStrategy;
}

export interface AppendedEvent {
  event: StoredEvent;
  /** True when the draft's `clientEventId` was already stored: nothing new was written. */
  duplicate: boolean;
}

export interface EventRange {
  /** Inclusive lower bound (default 0). */
  fromId?: number;
  /** Inclusive upper bound (default: the last event). */
  toId?: number;
  /** Newest first when true. */
  reverse?: boolean;
  limit: number;
}

export interface EventPageRange extends EventRange {
  maxBytes: number;
  incarnation?: string;
}

export interface EventPage {
  events: StoredEvent[];
  hasMore: boolean;
}

export interface ConversationPageRequest {
  /** Only this user's conversations; all of the tenant's when omitted. */
  userId?: string;
  limit: number;
  /** Opaque cursor from a previous page's `nextCursor`. */
  cursor?: string;
}

export interface ConversationPageResult {
  items: ConversationRecord[];
  nextCursor: string | null;
}

/** The conversation's stored state, scopes merged (`app:` / `user:` prefixed). */
export interface ConversationSnapshot {
  conversation: ConversationRecord;
  state: Record<string, unknown>;
}

/** A fork (docs/protocol.md "Branching"): the new conversation's id, its owner, what it copies. */
export interface ForkRequest {
  conversationId: string;
  /** The new conversation's owner: the caller. */
  userId: string;
  /** The last event copied; default the source's last. */
  atEventId?: number;
  /** Default: the source's. */
  title?: string;
  metadata?: Record<string, unknown>;
}

/** A rewind (docs/protocol.md "Branching"). */
export interface RewindRequest {
  /** Every event after this one is undone. */
  toEventId: number;
  /**
   * Regenerate: `toEventId` is a user message, and it is to be answered
   * again (the conversation's `answered_through` goes back below it).
   */
  answerAgain?: boolean;
  /** The rewind event's idempotency key: stored once, a repeat gets it back. */
  clientEventId?: string;
  /** As `AppendOptions.incarnation`. */
  incarnation?: string;
}

/**
 * The single source of truth: conversations, their event logs and scoped state.
 * Every method is scoped by tenant; a conversation of another tenant does not
 * exist for it. Implemented on Postgres (and PGlite) in `libs/store`.
 */
export interface ConversationStore {
  /**
   * Creates a conversation with its first events (`drafts`), in one
   * transaction: all of it is stored or none. Repeating an id the same tenant
   * and user already own returns the stored one with `created: false` and
   * stores nothing; an id owned by anyone else throws `ConflictError`. A
   * rewind among the drafts (a replayed history's) keeps its meaning: the
   * events it undid are marked undone by it, as `rewind` marked them
   * (`BadRequestError` when its point is not a live event before it).
   */
  createConversation(
    input: NewConversation,
    drafts?: readonly EventDraft[],
  ): Promise<{ conversation: ConversationRecord; created: boolean }>;
  getConversation(tenantId: string, conversationId: string): Promise<ConversationRecord | null>;
  getSnapshot(tenantId: string, conversationId: string): Promise<ConversationSnapshot | null>;
  /**
   * The `app:` and `user:` keys (prefixes kept) that `getSnapshot` merges into
   * the state of a conversation of this user in this app: how a running
   * session reads them again after another conversation changed them.
   */
  getScopedState(
    tenantId: string,
    appName: string,
    userId: string,
  ): Promise<Record<string, unknown>>;
  /** Newest activity first: `(updated_at desc, id desc)`, keyset pagination. */
  listConversations(
    tenantId: string,
    page: ConversationPageRequest,
  ): Promise<ConversationPageResult>;
  updateConversation(
    tenantId: string,
    conversationId: string,
    patch: ConversationPatch,
  ): Promise<ConversationRecord | null>;
  /** Deletes the conversation and all its events; false when it did not exist. */
  deleteConversation(tenantId: string, conversationId: string): Promise<boolean>;
  /**
   * Sets the status; with `expected`, only when the current status is one of
   * them. Resolves true when it changed the row.
   */
  setStatus(
    tenantId: string,
    conversationId: string,
    status: ConversationStatus,
    expected?: readonly ConversationStatus[],
  ): Promise<boolean>;
  /**
   * Marks every STARTING / RUNNING conversation STOPPED and returns them (a
   * standalone process starting up resumes what ran before it stopped).
   */
  resetRunningStatuses(): Promise<ConversationRef[]>;
  /**
   * One page of the STARTING / RUNNING conversations (of every tenant) whose
   * activity (`updated_at`) is older than `idleBefore`, in id order after
   * `afterId`: what the worker's reconciler checks for a lost job.
   */
  listLiveConversations(page: LiveConversationPage): Promise<ConversationRef[]>;
  /** Bumps `lease_epoch`, records the owner, returns the new epoch. */
  acquireLease(tenantId: string, conversationId: string, owner: string): Promise<number>;
  /**
   * Clears `lease_owner` if `owner` still holds the lease at `epoch` (a clean
   * hand-back: the next holder knows that no failover happened).
   */
  releaseLease(
    tenantId: string,
    conversationId: string,
    owner: string,
    epoch: number,
  ): Promise<void>;
  /**
   * Appends events in one transaction with gap-free ids; merges their state
   * deltas by scope; keeps `last_event_id`, `updated_at`, `agent_state` and
   * metrics in step. Throws `NotFoundError`, `LeaseLostError`, or
   * `ConflictError` when a `clientEventId` is reused with other content.
   */
  append(
    tenantId: string,
    conversationId: string,
    drafts: readonly EventDraft[],
    options?: AppendOptions,
  ): Promise<AppendedEvent[]>;
  readEvents(tenantId: string, conversationId: string, range: EventRange): Promise<StoredEvent[]>;
  /**
   * A page for a client (REST, replays): at most `range.limit` events and,
   * past the first, `range.maxBytes` bytes of them as JSON, with `hasMore`
   * when the range holds more. With `range.incarnation`, nothing unless the
   * conversation of that id is still that one.
   */
  readEventPage(
    tenantId: string,
    conversationId: string,
    range: EventPageRange,
  ): Promise<EventPage>;
  /**
   * The `last_event_id` of each conversation found (by id), in one read: how a
   * holder of many conversations sees which have new events.
   */
  lastEventIds(refs: readonly ConversationKey[]): Promise<Map<string, number>>;
  /**
   * Forks the source conversation in one transaction: a new conversation of
   * `request.userId` with the source's events `0..atEventId` (same ids,
   * payloads, timestamps; undone marks kept where their rewind is copied),
   * its conversation-scope state as it was after `atEventId` (rebuilt from
   * the events' stored deltas), the same agent and settings, metrics from 0,
   * every turn settled, and a `tool_result` (`is_error`, `extras.forked`)
   * for each copied tool call without one. `BadRequestError` (`at_event_id`)
   * for a point that is not an event of the source; `NotFoundError` when the
   * source is gone. A repeat of the same id, owner and source returns the
   * fork made first with `created: false`; an id taken otherwise is `ConflictError`.
   */
  fork(
    tenantId: string,
    sourceId: string,
    request: ForkRequest,
  ): Promise<{ conversation: ConversationRecord; created: boolean }>;
  /**
   * Rewinds in one transaction: appends the user event `{ action: "rewind",
   * args: { to_event_id } }` (carrying the state delta back to the state as
   * it was after `toEventId`), then a `tool_result` (`is_error`,
   * `extras.rewound`) for each tool call up to `toEventId` left without one,
   * marks every event after `toEventId` and before the rewind undone by it,
   * and restores the conversation-scope state. Turns up to the rewind are
   * settled (with `answerAgain`, all but the message at `toEventId`).
   * `BadRequestError` (`to_event_id`) for a point that is not an event, or
   * is undone; `NotFoundError`; a repeated `clientEventId` returns the first
   * rewind (`duplicate`), or `ConflictError` when it named another point.
   */
  rewind(tenantId: string, conversationId: string, request: RewindRequest): Promise<AppendedEvent>;
  /** The event stored with this idempotency key, if any. */
  findEventByClientEventId(
    tenantId: string,
    conversationId: string,
    clientEventId: string,
  ): Promise<StoredEvent | null>;
  /**
   * The tenant's model usage over UTC days `from..to`, grouped; only
   * `query.userId`'s when given. Usage outlives its conversations.
   */
  usageReport(tenantId: string, query: UsageQuery): Promise<UsageReport>;
  /** The cost of the tenant's (or one user's) model usage over UTC days `from..to`. */
  usageCost(tenantId: string, scope: UsageScope): Promise<number>;
}
