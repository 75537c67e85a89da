/**
 * What the data lifecycle (docs/protocol.md "Data lifecycle") stores beside the
 * conversations: the idle search of retention, the erasure jobs, the audit
 * trail, and deletions that write their erasure count or audit record in the
 * same transaction. Implemented on Postgres (and PGlite) in `libs/store`.
 */
import type { ConversationRef } from '../conversation.js';

/** One audit record to write: who (`actor`, a user id) did `action` to `target`. */
export interface AuditEntry {
  tenantId: string;
  actor: string;
  /** `user.erase`, `user.export`, `conversation.delete`, `webhook.retry`, … */
  action: string;
  /** What it acted on: `user:<id>`, `conversation:<id>`, `webhook_delivery:<id>`. */
  target: string;
}

export interface AuditRecord {
  id: string;
  time: Date;
  actor: string;
  action: string;
  target: string;
}

export interface AuditPage {
  records: AuditRecord[];
  nextCursor: string | null;
}

export type ErasureStatus = 'running' | 'done';

export interface ErasureRecord {
  id: string;
  tenantId: string;
  /** Null once done: nothing of the user stays. */
  userId: string | null;
  status: ErasureStatus;
  conversationsDeleted: number;
}

/** A conversation retention found idle, with the last event it had then. */
export interface IdleConversation extends ConversationRef {
  lastEventId: number;
}

/** What a deletion writes in its own transaction, beside the conversation's rows. */
export interface DeletionEffects {
  /** Counted in this erasure's `conversations_deleted` (only when the row was there). */
  erasureId?: string;
  /** Written with the deletion. */
  audit?: AuditEntry;
  /**
   * Retention: deleted only if no user event came after this id (a user who
   * came back meanwhile keeps it); events the stop stored do not count.
   */
  idleThroughEventId?: number;
  /** Only this incarnation of the id. */
  incarnation?: string;
}

export interface DataLifecycleStore {
  /**
   * Conversations of every tenant whose last activity is before `cutoff`,
   * at most `limit`, through the activity-hour index (a retention batch).
   */
  findIdleConversations(cutoff: Date, limit: number): Promise<IdleConversation[]>;
  /** Deletes the conversation with its events and `effects`, in one transaction. */
  deleteConversation(
    tenantId: string,
    conversationId: string,
    effects?: DeletionEffects,
  ): Promise<boolean>;
  /**
   * The user's conversations in the tenant, in id order after `afterId`, at
   * most `limit`: an erasure deletes them and asks again until none is left;
   * a user's export walks them.
   */
  userConversations(
    tenantId: string,
    userId: string,
    limit: number,
    afterId?: string,
  ): Promise<ConversationRef[]>;
  /**
   * A new erasure of the user (its audit record in the same transaction),
   * leased to `lease.owner` from the start; or the one running already
   * (`created: false`, no record, its lease untouched).
   */
  startErasure(
    tenantId: string,
    userId: string,
    audit: Omit<AuditEntry, 'tenantId' | 'target'>,
    at: Date,
    lease: { owner: string; until: Date },
  ): Promise<{ erasure: ErasureRecord; created: boolean }>;
  getErasure(tenantId: string, id: string): Promise<ErasureRecord | null>;
  /**
   * Takes a running erasure whose lease is free or past its time (that one
   * when `id` is given), for `owner` until `until`; null when there is none.
   */
  claimErasure(owner: string, now: Date, until: Date, id?: string): Promise<ErasureRecord | null>;
  /** Extends the lease; false when `owner` lost it. */
  renewErasure(id: string, owner: string, until: Date): Promise<boolean>;
  /**
   * Marks it done (and forgets its user id) if `owner` holds it and the user
   * has no conversation left in the tenant; false otherwise.
   */
  finishErasure(id: string, owner: string, at: Date): Promise<boolean>;
  /** The user's `user:` state in every app of the tenant. */
  deleteUserState(tenantId: string, userId: string): Promise<void>;
  /** The user's `user:` state (in `appName`), keys without prefix. */
  getUserState(tenantId: string, appName: string, userId: string): Promise<Record<string, unknown>>;
  /**
   * The user's webhook deliveries in the tenant, whatever their status: their
   * bodies carry what the user wrote and was answered.
   */
  deleteUserWebhookDeliveries(tenantId: string, userId: string): Promise<void>;
  /** Replaces the user's id in the tenant's usage rows by `erased` (kept for billing). */
  eraseFromUsage(tenantId: string, userId: string): Promise<void>;
  /** Replaces the user's id in the tenant's audit records by `erased`. */
  eraseFromAudit(tenantId: string, userId: string): Promise<void>;
  /** One audit record, in its own transaction (see `DeletionEffects.audit` for one beside an action). */
  recordAudit(entry: AuditEntry, at: Date): Promise<void>;
  /** The tenant's records, newest first. */
  listAudit(tenantId: string, limit: number, cursor?: string): Promise<AuditPage>;
}

/**
 * What an erasure asks of the ephemeral side (Redis in a cluster): to keep
 * nothing of the user (slots, rate limit) nor of their deleted conversations.
 */
export interface UserKeyEraser {
  /** The keys of one deleted conversation (connections, failovers, stop marks). */
  forgetConversation(conversationId: string): Promise<void>;
  /** Every key of the user: running conversations, slot expiries, rate-limit window. */
  forgetUser(tenantId: string, userId: string): Promise<void>;
}

/**
 * Lets one process of a deployment do a periodic task per period: the first
 * to ask within a period gets it (a Redis key with a TTL in a cluster).
 */
export interface PeriodLock {
  /** True when this process has the task for the next `periodMs`. */
  claim(periodMs: number): Promise<boolean>;
}
