/**
 * SQL that appends to the `events` table: one conversation's events in one
 * statement, or many conversations' in one, each moving its conversation's
 * row (last id, state, metrics, turn cost, agent state) along. The reads are
 * `EventRepository`'s.
 */
import type { ConversationMetrics, StoredEvent } from '@cs/protocol';
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';
import { metricsPlus } from './metrics-sql.js';
import { oneConversation } from './conversation-key-sql.js';

/** The metrics plus the counters in parameters $8 to $11. */
const METRICS_PLUS_USAGE = metricsPlus(8);

/** An event about to be written, its id assigned. */
export interface NewEventRow {
  id: number;
  source: StoredEvent['source'];
  type: string;
  /** The event body as a JSON object. */
  payload: Record<string, unknown>;
  cause: number | null;
  client_event_id: string | null;
}

/** Where a plain append put its events: the first id and the shared timestamp. */
export interface AppendedHead {
  firstId: number;
  at: Date;
}

/**
 * A plain append to one conversation: conversation-scope state, metrics, the
 * turn's cost and agent state ride along on its row.
 */
export interface PlainAppend {
  tenantId: string;
  conversationId: string;
  /**
   * The events as a JSON array of `NewEventRow`s (see `eventRowsJson`), each
   * `id` an offset (0, 1, …) from the first id, which the row's last_event_id gives.
   */
  rowsJson: string;
  count: number;
  /** Idempotency keys among the events: one already stored leaves the append undone. */
  clientEventIds: string[];
  leaseEpoch: number | null;
  /** The conversation's incarnation the writer knows; null: any. */
  incarnation: string | null;
  agentState: string | null;
  /** Moves `answered_through` up to this user message id; null: unchanged. */
  answeredThrough: number | null;
  /** Conversation-scope keys to set, as a JSON object, and keys to delete. */
  stateSet: string;
  stateDeleted: string[];
  metrics: ConversationMetrics;
  /** What the events add to the row's turn cost; null: they count none. */
  turnCost: TurnCostWrite | null;
  /**
   * A user message: left undone when the conversation's own
   * `multitask_strategy` is `reject` (a transaction then decides, under the
   * row lock, whether the agent is busy).
   */
  undoneUnderReject: boolean;
}

/**
 * The events' share of the row's turn cost (`countTurnCost` folded over
 * them): `costUsd` for the turn of `cause`, added to the row's count when
 * `continues` and the row counts that turn already, in its place otherwise.
 */
export interface TurnCostWrite {
  cause: number;
  costUsd: number;
  /** False when the events changed turns: what the row counted before does not add up. */
  continues: boolean;
}

export class EventAppendRepository {
  constructor(private readonly db: SqlQueryable) {}

  /**
   * One append in one statement: what `appendToLogs` does for many, without
   * the ordered locking that many rows need (about four times cheaper for
   * Postgres). On its own, or inside the transaction that tells repeats from
   * conflicts and merges `user:` / `app:` keys. Null when left undone.
   * `at` (ISO text) is the activity time, unless the row's is later, and the
   * events' timestamp.
   */
  async appendToLog(append: PlainAppend, at: string): Promise<AppendedHead | null> {
    const { rows } = await this.db.query<{ first_id: number; updated_at: Date }>(
      `WITH head AS (
         UPDATE conversations
            SET last_event_id = last_event_id + $3::int,
                agent_state = coalesce($5::text, agent_state),
                answered_through = greatest(answered_through, coalesce($15::bigint, -1)),
                state = (state || $6::jsonb) - $7::text[],
                metrics = ${METRICS_PLUS_USAGE},
                turn_cost_usd = CASE
                  WHEN $16::bigint IS NULL THEN turn_cost_usd
                  WHEN $18::boolean AND turn_cause = $16::bigint THEN turn_cost_usd + $17::numeric
                  ELSE $17::numeric END,
                turn_cause = coalesce($16::bigint, turn_cause),
                updated_at = greatest(updated_at, $19::timestamptz)
          WHERE ${oneConversation()}
            AND ($4::bigint IS NULL OR lease_epoch = $4::bigint)
            AND ($14::uuid IS NULL OR incarnation = $14::uuid)
            AND NOT ($20::boolean AND multitask_strategy IS NOT DISTINCT FROM 'reject')
            AND NOT EXISTS (
              SELECT 1 FROM events e
               WHERE e.conversation_id = $2 AND e.client_event_id = ANY ($13::text[]))
          RETURNING last_event_id - $3::int + 1 AS first_id, updated_at
       ), written AS (
         INSERT INTO events
           (conversation_id, id, tenant_id, source, type, payload, size_bytes, cause,
            client_event_id, lease_epoch, created_at, state_delta)
         SELECT $2::uuid, head.first_id + e.id, $1::text, e.source, e.type, e.payload,
                e.size_bytes, e.cause, e.client_event_id, $4::bigint, head.updated_at,
                e.state_delta
           FROM head,
                jsonb_to_recordset($12::jsonb)
                  AS e(id bigint, source text, type text, payload jsonb, size_bytes int,
                       cause bigint, client_event_id text, state_delta jsonb)
       )
       SELECT first_id, updated_at FROM head`,
      [
        append.tenantId,
        append.conversationId,
        append.count,
        append.leaseEpoch,
        append.agentState,
        append.stateSet,
        append.stateDeleted,
        append.metrics.iterations,
        append.metrics.prompt_tokens,
        append.metrics.completion_tokens,
        append.metrics.cost_usd,
        append.rowsJson,
        append.clientEventIds,
        append.incarnation,
        append.answeredThrough,
        append.turnCost?.cause ?? null,
        append.turnCost?.costUsd ?? 0,
        append.turnCost?.continues ?? false,
        at,
        append.undoneUnderReject,
      ],
      PREPARED,
    );
    const row = rows[0];
    return row ? { firstId: row.first_id, at: row.updated_at } : null;
  }

  /**
   * Plain appends to several conversations (one append each) in one
   * statement, outside any transaction. The rows are locked one by one, by
   * key, in the order of `appends` (sorted by conversation id, so that two
   * such statements never deadlock); each row's tenant and lease epoch are
   * checked there (and its incarnation, when given), and the UPDATE touches only rows locked so. The UPDATE moves last_event_id on by the number of events
   * and merges state and metrics; the INSERT takes its ids from what the
   * UPDATE returned. An append is left undone, and missing from the result,
   * when its conversation is gone, held under a newer epoch, already has
   * one of its idempotency keys, or is under `reject` for a user message
   * (`undoneUnderReject`); a key stored concurrently fails the whole
   * statement with a unique violation, and nothing is written. `at` as in
   * `appendToLog`. The one statement that spans conversations: off on Citus
   * (`crossConversationBatches`).
   */
  async appendToLogs(
    appends: readonly PlainAppend[],
    at: string,
  ): Promise<Map<string, AppendedHead>> {
    // Locks are taken in this order: by conversation id, the same in every process.
    const sorted = [...appends].sort((a, b) =>
      a.conversationId < b.conversationId ? -1 : a.conversationId > b.conversationId ? 1 : 0,
    );
    // State and events go in as the JSON text serialized once upstream.
    const batchJson = `[${sorted
      .map((append) => {
        const fields = JSON.stringify({
          tenant_id: append.tenantId,
          conversation_id: append.conversationId,
          count: append.count,
          lease_epoch: append.leaseEpoch,
          incarnation: append.incarnation,
          agent_state: append.agentState,
          answered_through: append.answeredThrough,
          state_deleted: append.stateDeleted,
          iterations: append.metrics.iterations,
          prompt_tokens: append.metrics.prompt_tokens,
          completion_tokens: append.metrics.completion_tokens,
          cost_usd: append.metrics.cost_usd,
          turn_cause: append.turnCost?.cause ?? null,
          turn_cost_usd: append.turnCost?.costUsd ?? 0,
          turn_cost_continues: append.turnCost?.continues ?? false,
          client_event_ids: append.clientEventIds,
          undone_under_reject: append.undoneUnderReject,
        });
        return `${fields.slice(0, -1)},"state_set":${append.stateSet},"events":${append.rowsJson}}`;
      })
      .join(',')}]`;
    const { rows } = await this.db.query<{
      conversation_id: string;
      first_id: number;
      updated_at: Date;
    }>(
      `WITH batch AS (
         SELECT *
           FROM jsonb_to_recordset($1::jsonb)
             AS b(tenant_id text, conversation_id uuid, count int, lease_epoch bigint,
                  incarnation uuid, agent_state text, answered_through bigint, state_set jsonb, state_deleted text[], iterations numeric,
                  prompt_tokens numeric, completion_tokens numeric, cost_usd numeric,
                  turn_cause bigint, turn_cost_usd numeric, turn_cost_continues boolean,
                  client_event_ids text[], undone_under_reject boolean, events jsonb)
       ), locked AS MATERIALIZED (
         SELECT c.id
           FROM batch b
           CROSS JOIN LATERAL (
             SELECT id, tenant_id, lease_epoch, incarnation, multitask_strategy
               FROM conversations
              WHERE id = b.conversation_id
                FOR UPDATE
           ) c
          WHERE c.tenant_id = b.tenant_id
            AND (b.lease_epoch IS NULL OR c.lease_epoch = b.lease_epoch)
            AND (b.incarnation IS NULL OR c.incarnation = b.incarnation)
            AND NOT (b.undone_under_reject AND c.multitask_strategy IS NOT DISTINCT FROM 'reject')
            -- Under OR, the key check stays a probe of the conversation's key index,
            -- made only for a row with keys. Alone, the planner could make it an anti
            -- join over every partition of events, and did in generic plans built on
            -- small tables: each batch of a busy worker then read the whole log.
            AND (cardinality(b.client_event_ids) = 0 OR NOT EXISTS (
              SELECT 1 FROM events e
               WHERE e.conversation_id = b.conversation_id
                 AND e.client_event_id = ANY (b.client_event_ids)))
       ), head AS (
         UPDATE conversations c
            SET last_event_id = c.last_event_id + b.count,
                agent_state = coalesce(b.agent_state, c.agent_state),
                answered_through = greatest(c.answered_through, coalesce(b.answered_through, -1)),
                state = (c.state || b.state_set) - b.state_deleted,
                metrics = jsonb_build_object(
                  'iterations', coalesce((c.metrics ->> 'iterations')::numeric, 0) + b.iterations,
                  'prompt_tokens',
                    coalesce((c.metrics ->> 'prompt_tokens')::numeric, 0) + b.prompt_tokens,
                  'completion_tokens',
                    coalesce((c.metrics ->> 'completion_tokens')::numeric, 0) + b.completion_tokens,
                  'cost_usd', coalesce((c.metrics ->> 'cost_usd')::numeric, 0) + b.cost_usd),
                turn_cost_usd = CASE
                  WHEN b.turn_cause IS NULL THEN c.turn_cost_usd
                  WHEN b.turn_cost_continues AND c.turn_cause = b.turn_cause
                    THEN c.turn_cost_usd + b.turn_cost_usd
                  ELSE b.turn_cost_usd END,
                turn_cause = coalesce(b.turn_cause, c.turn_cause),
                updated_at = greatest(c.updated_at, $3::timestamptz)
           FROM batch b
          WHERE c.id = ANY ($2::uuid[]) AND c.id IN (SELECT id FROM locked)
            AND c.id = b.conversation_id
            AND (b.lease_epoch IS NULL OR c.lease_epoch = b.lease_epoch)
          RETURNING c.id, c.tenant_id, c.last_event_id - b.count + 1 AS first_id, c.updated_at,
                    b.lease_epoch, b.events
       ), written AS (
         INSERT INTO events
           (conversation_id, id, tenant_id, source, type, payload, size_bytes, cause,
            client_event_id, lease_epoch, created_at, state_delta)
         SELECT head.id, head.first_id + e.id, head.tenant_id, e.source, e.type, e.payload,
                e.size_bytes, e.cause, e.client_event_id, head.lease_epoch, head.updated_at,
                e.state_delta
           FROM head,
                jsonb_to_recordset(head.events)
                  AS e(id bigint, source text, type text, payload jsonb, size_bytes int,
                       cause bigint, client_event_id text, state_delta jsonb)
       )
       SELECT id AS conversation_id, first_id, updated_at FROM head`,
      // The ids again as an array: the planner then looks the rows up by key
      // rather than joining a whole table against a function's rows.
      [batchJson, sorted.map((append) => append.conversationId), at],
      PREPARED,
    );
    return new Map(
      rows.map((row) => [row.conversation_id, { firstId: row.first_id, at: row.updated_at }]),
    );
  }
}
