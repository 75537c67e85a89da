/**
 * SQL of branching (docs/protocol.md "Branching"): the state as it was after an
 * event, rebuilt from the events' stored deltas; a fork's row and its copied
 * events (one INSERT … SELECT); tool calls left without a result; the undone
 * marks of a rewind. Every statement names one conversation (and its tenant).
 */
import type { StoredEvent } from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';
import { toStoredEvent } from './event.repository.js';
import { oneConversation } from './conversation-key-sql.js';

/** What a fork or a rewind reads of its conversation, under a lock. */
export interface BranchHead {
  lastEventId: number;
  incarnation: string;
  userId: string;
  state: Record<string, unknown>;
}

export interface ForkRow {
  tenantId: string;
  sourceId: string;
  id: string;
  userId: string;
  title: string | null;
  /** JSON text, or null: the source's. */
  metadata: string | null;
  atEventId: number;
  /** The conversation-scope state after `atEventId`, as JSON text. */
  state: string;
  agentState: string | null;
  at: string;
}

export class BranchRepository {
  constructor(private readonly db: SqlQueryable) {}

  /**
   * Locks the row until the transaction ends: `FOR SHARE` for a fork (appends
   * wait, other forks do not), `FOR UPDATE` for a rewind.
   */
  async lock(tenantId: string, id: string, mode: 'share' | 'update'): Promise<BranchHead | null> {
    const { rows } = await this.db.query<{
      last_event_id: number;
      incarnation: string;
      user_id: string;
      state: Record<string, unknown>;
    }>(
      `SELECT last_event_id, incarnation, user_id, state
         FROM conversations
        WHERE ${oneConversation()}
        ${mode === 'share' ? 'FOR SHARE' : 'FOR UPDATE'}`,
      [tenantId, id],
    );
    const row = rows[0];
    if (!row) return null;
    return {
      lastEventId: Number(row.last_event_id),
      incarnation: row.incarnation,
      userId: row.user_id,
      state: row.state,
    };
  }

  /** The event's undone mark: undefined when there is no such event, null when not undone. */
  async undoneBy(
    tenantId: string,
    id: string,
    eventId: number,
  ): Promise<number | null | undefined> {
    const { rows } = await this.db.query<{ undone_by: number | string | null }>(
      `SELECT undone_by FROM events WHERE tenant_id = $1 AND conversation_id = $2 AND id = $3`,
      [tenantId, id, eventId],
    );
    const row = rows[0];
    if (!row) return undefined;
    return row.undone_by === null ? null : Number(row.undone_by);
  }

  /**
   * The conversation-scope state after `atId`: for each key, the value of the
   * last delta that set or deleted it among the events up to `atId` that are
   * not undone as seen from there (undone by a rewind at or before `atId`).
   */
  async stateAt(tenantId: string, id: string, atId: number): Promise<Record<string, unknown>> {
    const { rows } = await this.db.query<{ state: Record<string, unknown> }>(
      `SELECT coalesce(jsonb_object_agg(key, value) FILTER (WHERE value <> 'null'::jsonb),
                       '{}'::jsonb) AS state
         FROM (
           SELECT DISTINCT ON (d.key) d.key, d.value
             FROM events e
             CROSS JOIN LATERAL jsonb_each(e.state_delta) AS d(key, value)
            WHERE e.tenant_id = $1 AND e.conversation_id = $2 AND e.id <= $3
              AND e.state_delta IS NOT NULL
              AND (e.undone_by IS NULL OR e.undone_by > $3)
            ORDER BY d.key, e.id DESC
         ) latest`,
      [tenantId, id, atId],
    );
    return rows[0]?.state ?? {};
  }

  /**
   * The agent state of the last `agent_state_changed` up to `atId` that is
   * not undone as seen from there; null when there is none.
   */
  async agentStateAt(tenantId: string, id: string, atId: number): Promise<string | null> {
    const { rows } = await this.db.query<{ agent_state: string | null }>(
      `SELECT payload -> 'extras' ->> 'agent_state' AS agent_state
         FROM events
        WHERE tenant_id = $1 AND conversation_id = $2 AND id <= $3
          AND type = 'agent_state_changed' AND source <> 'user'
          AND (undone_by IS NULL OR undone_by > $3)
        ORDER BY id DESC
        LIMIT 1`,
      [tenantId, id, atId],
    );
    return rows[0]?.agent_state ?? null;
  }

  /**
   * Tool calls up to `atId` with no `tool_result` up to `atId`, neither
   * undone as seen from `visibleFrom` (an undone mark above it does not count).
   */
  async callsWithoutResult(
    tenantId: string,
    id: string,
    atId: number,
    visibleFrom: number,
  ): Promise<StoredEvent[]> {
    const { rows } = await this.db.query<{
      id: number;
      source: StoredEvent['source'];
      payload: Record<string, unknown>;
      cause: number | null;
      client_event_id: string | null;
      created_at: Date;
    }>(
      `SELECT c.id, c.source, c.payload, c.cause, c.client_event_id, c.created_at
         FROM events c
        WHERE c.tenant_id = $1 AND c.conversation_id = $2 AND c.id <= $3
          AND c.type = 'tool_call' AND c.source = 'agent'
          AND (c.undone_by IS NULL OR c.undone_by > $4)
          AND c.id NOT IN (
            SELECT r.cause
              FROM events r
             WHERE r.tenant_id = $1 AND r.conversation_id = $2 AND r.id <= $3
               AND r.type = 'tool_result' AND r.cause IS NOT NULL
               AND (r.undone_by IS NULL OR r.undone_by > $4))
        ORDER BY c.id`,
      [tenantId, id, atId, visibleFrom],
    );
    return rows.map(toStoredEvent);
  }

  /**
   * The fork's row, made from the source's in one statement (agent,
   * instructions, settings and lease epoch: the copied events' epochs never
   * exceed it). Null when the id is taken or the source is gone.
   */
  async insertFork(row: ForkRow): Promise<boolean> {
    const { rowCount } = await this.db.query(
      `INSERT INTO conversations
         (id, tenant_id, user_id, app_name, title, metadata, agent, instructions,
          confirmation_mode, multitask_strategy, max_iterations, max_budget_usd,
          state, agent_state, last_event_id, answered_through, lease_epoch,
          parent_conversation_id, forked_from_event_id, created_at, updated_at)
       SELECT $3::uuid, s.tenant_id, $4::text, s.app_name, coalesce($5::text, s.title),
              coalesce($6::jsonb, s.metadata), s.agent, s.instructions,
              s.confirmation_mode, s.multitask_strategy, s.max_iterations, s.max_budget_usd,
              $8::jsonb, $9::text, $7::bigint, $7::bigint, s.lease_epoch,
              s.id, $7::bigint, $10::timestamptz, $10::timestamptz
         FROM conversations s
        WHERE ${oneConversation('s')}
       ON CONFLICT (id) DO NOTHING`,
      [
        row.tenantId,
        row.sourceId,
        row.id,
        row.userId,
        row.title,
        row.metadata,
        row.atEventId,
        row.state,
        row.agentState,
        row.at,
      ],
    );
    return rowCount > 0;
  }

  /**
   * Copies the source's events `0..atId` into the fork in one statement: the
   * same ids, payloads, timestamps, epochs and deltas; an undone mark only
   * where its rewind is copied too.
   */
  async copyEvents(
    tenantId: string,
    sourceId: string,
    forkId: string,
    atId: number,
  ): Promise<void> {
    await this.db.query(
      `INSERT INTO events
         (conversation_id, id, tenant_id, source, type, payload, size_bytes, cause,
          client_event_id, lease_epoch, created_at, state_delta, undone_by)
       SELECT $3::uuid, id, tenant_id, source, type, payload, size_bytes, cause,
              client_event_id, lease_epoch, created_at, state_delta,
              CASE WHEN undone_by <= $4 THEN undone_by END
         FROM events
        WHERE tenant_id = $1 AND conversation_id = $2 AND id <= $4`,
      [tenantId, sourceId, forkId, atId],
    );
  }

  /** Sets the undone marks given (event id → rewind id): a replayed history's, in one statement. */
  async setUndone(tenantId: string, id: string, marks: ReadonlyMap<number, number>): Promise<void> {
    await this.db.query(
      `UPDATE events AS e SET undone_by = m.undone_by
         FROM unnest($3::bigint[], $4::bigint[]) AS m(id, undone_by)
        WHERE e.tenant_id = $1 AND e.conversation_id = $2 AND e.id = m.id`,
      [tenantId, id, [...marks.keys()], [...marks.values()]],
    );
  }

  /** Marks the events after `toId` and before `rewindId` undone by it (those not undone already). */
  async markUndone(tenantId: string, id: string, toId: number, rewindId: number): Promise<void> {
    await this.db.query(
      `UPDATE events SET undone_by = $4
        WHERE tenant_id = $1 AND conversation_id = $2 AND id > $3 AND id < $4
          AND undone_by IS NULL`,
      [tenantId, id, toId, rewindId],
    );
  }

  /**
   * After a rewind: the restored state, and the turns settled through
   * `answeredThrough` (set, not raised: a regenerate lowers it); a regenerated
   * turn counts its cost afresh.
   */
  async settleRewind(
    tenantId: string,
    id: string,
    state: string,
    answeredThrough: number,
    answerAgain: boolean,
  ): Promise<void> {
    await this.db.query(
      `UPDATE conversations
          SET state = $3::jsonb,
              answered_through = $4::bigint,
              turn_cause = CASE WHEN $5::boolean THEN NULL ELSE turn_cause END,
              turn_cost_usd = CASE WHEN $5::boolean THEN 0 ELSE turn_cost_usd END
        WHERE ${oneConversation()}`,
      [tenantId, id, state, answeredThrough, answerAgain],
    );
  }
}
