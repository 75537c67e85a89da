/**
 * SQL of the `conversations` table. Every statement filters by tenant_id,
 * except the start-up reset, which is process-wide by design.
 *
 * A statement about one conversation finds it with `oneConversation()`
 * (conversation-key-sql.ts), through its primary key whatever the statistics.
 */
import type {
  ConversationPatch,
  ConversationRecord,
  ConversationRef,
  NewConversation,
} from '@cs/core';
import { DEFAULT_SETTINGS, EMPTY_METRICS } from '@cs/core';
import type {
  AgentState,
  ConversationMetrics,
  ConversationStatus,
  MultitaskStrategy,
} from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';
import { metricsPlus } from './metrics-sql.js';
import { oneConversation } from './conversation-key-sql.js';

/** The metrics plus the counters in parameters $8 to $11. */
const METRICS_PLUS_USAGE = metricsPlus(8);

interface ConversationRow {
  id: string;
  tenant_id: string;
  user_id: string;
  app_name: string;
  title: string;
  metadata: Record<string, unknown>;
  agent: ConversationRecord['agent'];
  instructions: string | null;
  status: ConversationStatus;
  agent_state: AgentState | null;
  metrics: Partial<ConversationMetrics>;
  last_event_id: number;
  lease_epoch: number;
  lease_owner: string | null;
  incarnation: string;
  answered_through: number;
  turn_cause: number | null;
  turn_cost_usd: string | number;
  confirmation_mode: boolean;
  multitask_strategy: MultitaskStrategy | null;
  max_iterations: number | null;
  max_budget_usd: string | number | null;
  created_at: Date;
  updated_at: Date;
  parent_conversation_id: string | null;
  forked_from_event_id: number | string | null;
}

const COLUMNS = `id, tenant_id, user_id, app_name, title, metadata, agent, instructions, status,
  agent_state, metrics, last_event_id, lease_epoch, lease_owner, incarnation, answered_through,
  turn_cause, turn_cost_usd, confirmation_mode, multitask_strategy, max_iterations,
  max_budget_usd, created_at, updated_at, parent_conversation_id, forked_from_event_id`;

export interface ScopeStates {
  app: Record<string, unknown>;
  user: Record<string, unknown>;
  conversation: Record<string, unknown>;
}

/** A row of a conversation list, with its activity time at full (microsecond) precision. */
export interface ListedConversation {
  record: ConversationRecord;
  updatedAtMicros: string;
}

/** Where a list page starts: strictly after this (updated_at, id). */
export interface ListPosition {
  updatedAtMicros: string;
  id: string;
}

/** What an append needs to know of the conversation, read under its row lock. */
export interface AppendHead {
  userId: string;
  appName: string;
  lastEventId: number;
  leaseEpoch: number;
  incarnation: string;
  agentState: AgentState | null;
  answeredThrough: number;
  /** The conversation's own strategy; null: the deployment's. */
  multitaskStrategy: MultitaskStrategy | null;
}

export class ConversationRepository {
  constructor(private readonly db: SqlQueryable) {}

  /**
   * Inserts unless the id exists (for anyone); null when it did. `at` is its
   * creation and first activity time, from the store's one write clock (as
   * every later activity time is), so that activity order never mixes clocks.
   */
  async insertIfAbsent(input: NewConversation, at: string): Promise<ConversationRecord | null> {
    const settings = input.settings ?? DEFAULT_SETTINGS;
    const { rows } = await this.db.query<ConversationRow>(
      `INSERT INTO conversations (id, tenant_id, user_id, app_name, title, metadata, agent, instructions,
                                  confirmation_mode, multitask_strategy, max_iterations, max_budget_usd,
                                  created_at, updated_at)
       VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10, $11, $12, $13::timestamptz, $13::timestamptz)
       ON CONFLICT (id) DO NOTHING
       RETURNING ${COLUMNS}`,
      [
        input.id,
        input.tenantId,
        input.userId,
        input.appName,
        input.title,
        JSON.stringify(input.metadata),
        JSON.stringify(input.agent),
        input.instructions,
        settings.confirmationMode,
        settings.multitaskStrategy,
        settings.maxIterations,
        settings.maxBudgetUsd,
        at,
      ],
    );
    return rows[0] ? toRecord(rows[0]) : null;
  }

  async find(tenantId: string, id: string): Promise<ConversationRecord | null> {
    const { rows } = await this.db.query<ConversationRow>(
      `SELECT ${COLUMNS} FROM conversations WHERE ${oneConversation()}`,
      [tenantId, id],
      PREPARED,
    );
    return rows[0] ? toRecord(rows[0]) : null;
  }

  /** The conversation with the states of its app, user and conversation scopes. */
  async findWithScopes(
    tenantId: string,
    id: string,
  ): Promise<{ record: ConversationRecord; scopes: ScopeStates } | null> {
    const { rows } = await this.db.query<
      ConversationRow & {
        state: Record<string, unknown>;
        app_state: Record<string, unknown> | null;
        user_state: Record<string, unknown> | null;
      }
    >(
      `SELECT c.id, c.tenant_id, c.user_id, c.app_name, c.title, c.metadata, c.agent,
              c.instructions, c.status, c.agent_state, c.metrics, c.last_event_id,
              c.lease_epoch, c.lease_owner, c.incarnation, c.answered_through,
              c.turn_cause, c.turn_cost_usd, c.confirmation_mode, c.multitask_strategy,
              c.max_iterations, c.max_budget_usd,
              c.created_at, c.updated_at, c.parent_conversation_id, c.forked_from_event_id,
              c.state, a.state AS app_state, u.state AS user_state
         FROM conversations c
         LEFT JOIN app_states a
           ON a.tenant_id = c.tenant_id AND a.app_name = c.app_name
         LEFT JOIN user_states u
           ON u.tenant_id = c.tenant_id AND u.app_name = c.app_name AND u.user_id = c.user_id
        WHERE ${oneConversation('c')}`,
      [tenantId, id],
      PREPARED,
    );
    const row = rows[0];
    if (!row) return null;
    return {
      record: toRecord(row),
      scopes: { app: row.app_state ?? {}, user: row.user_state ?? {}, conversation: row.state },
    };
  }

  /**
   * One page in `(updated_at desc, id desc)` order, of one user or of the
   * whole tenant (`userId` null). The position compares at microsecond
   * precision, which a JS Date would lose.
   */
  async listPage(
    tenantId: string,
    userId: string | null,
    after: ListPosition | null,
    limit: number,
  ): Promise<ListedConversation[]> {
    const { rows } = await this.db.query<ConversationRow & { updated_at_us: string }>(
      `SELECT ${COLUMNS},
              (extract(epoch FROM updated_at) * 1000000)::bigint::text AS updated_at_us
         FROM conversations
        WHERE tenant_id = $1
          AND ($2::text IS NULL OR user_id = $2::text)
          AND ($3::bigint IS NULL
               OR (updated_at, id) < (timestamptz 'epoch' + $3::bigint * interval '1 microsecond', $4::uuid))
        ORDER BY updated_at DESC, id DESC
        LIMIT $5`,
      [tenantId, userId, after?.updatedAtMicros ?? null, after?.id ?? null, limit],
    );
    return rows.map((row) => ({ record: toRecord(row), updatedAtMicros: row.updated_at_us }));
  }

  /** Replaces the fields given (undefined: keep) and marks the conversation active at `at` (ISO text). */
  async update(
    tenantId: string,
    id: string,
    patch: ConversationPatch,
    at: string,
  ): Promise<ConversationRecord | null> {
    const { rows } = await this.db.query<ConversationRow>(
      `UPDATE conversations
          SET title = coalesce($3::text, title),
              metadata = coalesce($4::jsonb, metadata),
              confirmation_mode = coalesce($5::boolean, confirmation_mode),
              multitask_strategy = coalesce($6::text, multitask_strategy),
              metrics = CASE WHEN $7::boolean THEN ${METRICS_PLUS_USAGE} ELSE metrics END,
              updated_at = greatest(updated_at, $12::timestamptz)
        WHERE ${oneConversation()}
        RETURNING ${COLUMNS}`,
      [
        tenantId,
        id,
        patch.title ?? null,
        patch.metadata === undefined ? null : JSON.stringify(patch.metadata),
        patch.confirmationMode ?? null,
        patch.multitaskStrategy ?? null,
        patch.addMetrics !== undefined,
        patch.addMetrics?.iterations ?? 0,
        patch.addMetrics?.prompt_tokens ?? 0,
        patch.addMetrics?.completion_tokens ?? 0,
        patch.addMetrics?.cost_usd ?? 0,
        at,
      ],
    );
    return rows[0] ? toRecord(rows[0]) : null;
  }

  /** Its events go with it (ON DELETE CASCADE), in the same statement. */
  async delete(tenantId: string, id: string): Promise<boolean> {
    const { rowCount } = await this.db.query(
      `DELETE FROM conversations WHERE ${oneConversation()}`,
      [tenantId, id],
    );
    return rowCount > 0;
  }

  /** Sets the status, when `expected` is given only from one of those; true when it did. */
  async setStatus(
    tenantId: string,
    id: string,
    status: ConversationStatus,
    expected: readonly ConversationStatus[] | null,
  ): Promise<boolean> {
    const { rowCount } = await this.db.query(
      `UPDATE conversations SET status = $3
        WHERE ${oneConversation()} AND ($4::text[] IS NULL OR status = ANY($4::text[]))`,
      [tenantId, id, status, expected],
    );
    return rowCount > 0;
  }

  /** Process-wide on purpose: a standalone process starting owns every conversation. */
  async resetRunningStatuses(): Promise<ConversationRef[]> {
    const { rows } = await this.db.query<{
      tenant_id: string;
      user_id: string;
      id: string;
      incarnation: string;
    }>(
      `UPDATE conversations SET status = 'STOPPED'
        WHERE status IN ('STARTING', 'RUNNING')
        RETURNING tenant_id, user_id, id, incarnation`,
    );
    return rows.map((row) => ({
      tenantId: row.tenant_id,
      userId: row.user_id,
      conversationId: row.id,
      incarnation: row.incarnation,
    }));
  }

  /**
   * Process-wide on purpose (the worker's reconciler): one page of the live
   * conversations idle since before `idleBefore`, in id order, read through
   * the partial index of live conversations (0012): a range of it, however
   * many conversations the table holds.
   */
  async listLive(
    idleBefore: Date,
    afterId: string | null,
    limit: number,
  ): Promise<ConversationRef[]> {
    const { rows } = await this.db.query<{
      tenant_id: string;
      user_id: string;
      id: string;
      incarnation: string;
    }>(
      `SELECT tenant_id, user_id, id, incarnation
         FROM conversations
        WHERE status IN ('STARTING', 'RUNNING')
          AND ($2::uuid IS NULL OR id > $2::uuid)
          AND updated_at < $1::timestamptz
        ORDER BY id
        LIMIT $3`,
      [idleBefore.toISOString(), afterId, limit],
    );
    return rows.map((row) => ({
      tenantId: row.tenant_id,
      userId: row.user_id,
      conversationId: row.id,
      incarnation: row.incarnation,
    }));
  }

  /**
   * `last_event_id` by conversation id, for the (tenant, id) pairs found. A
   * read of many conversations, but by key: `id = ANY` lets Postgres (and
   * Citus, which prunes shards by it) look up only those rows.
   */
  async lastEventIds(
    tenantIds: readonly string[],
    ids: readonly string[],
  ): Promise<Map<string, number>> {
    const { rows } = await this.db.query<{ id: string; last_event_id: number }>(
      `SELECT c.id, c.last_event_id
         FROM conversations c
        WHERE c.id = ANY ($2::uuid[])
          AND (c.tenant_id, c.id) IN (SELECT * FROM unnest($1::text[], $2::uuid[]))`,
      // Not prepared: its best plan depends on how many ids it gets against how
      // many conversations there are (a generic plan, kept from when the table
      // was small, read the whole table on every catch-up).
      [tenantIds, ids],
    );
    return new Map(rows.map((row) => [row.id, row.last_event_id]));
  }

  /** The new epoch, or null when the conversation does not exist. */
  async acquireLease(tenantId: string, id: string, owner: string): Promise<number | null> {
    const { rows } = await this.db.query<{ lease_epoch: number }>(
      `UPDATE conversations
          SET lease_epoch = lease_epoch + 1, lease_owner = $3
        WHERE ${oneConversation()}
        RETURNING lease_epoch`,
      [tenantId, id, owner],
    );
    return rows[0]?.lease_epoch ?? null;
  }

  /** Clears the owner if it still holds the lease at that epoch; true when it did. */
  async releaseLease(tenantId: string, id: string, owner: string, epoch: number): Promise<boolean> {
    const { rowCount } = await this.db.query(
      `UPDATE conversations SET lease_owner = NULL
        WHERE ${oneConversation()} AND lease_owner = $3 AND lease_epoch = $4`,
      [tenantId, id, owner, epoch],
    );
    return rowCount > 0;
  }

  /**
   * Locks the row until the transaction ends: appends to one conversation run
   * one after another, so ids are gap-free and the lease check holds.
   */
  async lockForAppend(tenantId: string, id: string): Promise<AppendHead | null> {
    const { rows } = await this.db.query<{
      user_id: string;
      app_name: string;
      last_event_id: number;
      lease_epoch: number;
      incarnation: string;
      agent_state: AgentState | null;
      answered_through: number;
      multitask_strategy: MultitaskStrategy | null;
    }>(
      `SELECT user_id, app_name, last_event_id, lease_epoch, incarnation, agent_state,
              answered_through, multitask_strategy
         FROM conversations
        WHERE ${oneConversation()}
        FOR UPDATE`,
      [tenantId, id],
      PREPARED,
    );
    const row = rows[0];
    if (!row) return null;
    return {
      userId: row.user_id,
      appName: row.app_name,
      lastEventId: row.last_event_id,
      leaseEpoch: row.lease_epoch,
      incarnation: row.incarnation,
      agentState: row.agent_state,
      answeredThrough: Number(row.answered_through),
      multitaskStrategy: row.multitask_strategy,
    };
  }
}

function toRecord(row: ConversationRow): ConversationRecord {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    userId: row.user_id,
    appName: row.app_name,
    title: row.title,
    metadata: row.metadata,
    agent: row.agent,
    instructions: row.instructions,
    status: row.status,
    agentState: row.agent_state,
    lastEventId: row.last_event_id,
    leaseEpoch: row.lease_epoch,
    leaseOwner: row.lease_owner,
    incarnation: row.incarnation,
    answeredThrough: row.answered_through,
    turnCost:
      row.turn_cause === null
        ? null
        : { cause: row.turn_cause, costUsd: Number(row.turn_cost_usd) },
    settings: {
      confirmationMode: row.confirmation_mode,
      multitaskStrategy: row.multitask_strategy,
      maxIterations: row.max_iterations,
      maxBudgetUsd: row.max_budget_usd === null ? null : Number(row.max_budget_usd),
    },
    metrics: { ...EMPTY_METRICS, ...row.metrics },
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    forkedFrom:
      row.parent_conversation_id === null || row.forked_from_event_id === null
        ? null
        : {
            conversationId: row.parent_conversation_id,
            eventId: Number(row.forked_from_event_id),
          },
  };
}
