/**
 * The `DataLifecycleStore` on Postgres or PGlite: retention's idle search,
 * erasure jobs and the audit trail (migration 0011). Each statement is
 * short: a retention batch or an erasure deletes one conversation per
 * transaction, so no lock is held longer than one conversation's delete.
 * Times are parameters, never now() inside an UPDATE (docs/scaling.md).
 */
import { randomUUID } from 'node:crypto';
import type {
  AuditEntry,
  AuditPage,
  ConversationRef,
  DataLifecycleStore,
  DeletionEffects,
  ErasureRecord,
  IdleConversation,
} from '@cs/core';
import { BadRequestError } from '@cs/core';
import { ERASED_USER } from '@cs/protocol';
import { isUuid } from './conversation-page.cursor.js';
import type { SqlDatabase, SqlQueryable } from './database/sql-database.js';
import { UNIQUE_VIOLATION, sqlErrorCode } from './database/sql-database.js';
import { oneConversation } from './repositories/conversation-key-sql.js';

/** Where activity hours are binned from (migration 0011). */
export const HOUR_ORIGIN = '2000-01-01T00:00:00Z';

/** Retention's search: $1 the cutoff, $2 `HOUR_ORIGIN`, $3 the batch size. */
export const IDLE_CONVERSATIONS_SQL = `
  SELECT tenant_id, user_id, id, incarnation, last_event_id
    FROM conversations
   WHERE activity_hour <= date_bin('1 hour', $1::timestamptz, $2::timestamptz)
     AND updated_at < $1::timestamptz
   ORDER BY activity_hour
   LIMIT $3`;

interface ErasureRow {
  id: string;
  tenant_id: string;
  user_id: string | null;
  status: ErasureRecord['status'];
  conversations_deleted: number;
}

const ERASURE_COLUMNS = 'id, tenant_id, user_id, status, conversations_deleted';

function toErasure(row: ErasureRow): ErasureRecord {
  return {
    id: row.id,
    tenantId: row.tenant_id,
    userId: row.user_id,
    status: row.status,
    conversationsDeleted: Number(row.conversations_deleted),
  };
}

/** The audit `page_id`: the last record's id, as decimal text. */
const AUDIT_CURSOR = /^[1-9]\d{0,15}$/;

export class PostgresDataLifecycleStore implements DataLifecycleStore {
  constructor(private readonly database: SqlDatabase) {}

  /**
   * The hours up to the cutoff's through `conversations_activity_hour_idx`,
   * then updated_at on those rows: the cutoff's own hour holds rows on both
   * sides of it. Oldest hours first.
   */
  async findIdleConversations(cutoff: Date, limit: number): Promise<IdleConversation[]> {
    const { rows } = await this.database.query<{
      tenant_id: string;
      user_id: string;
      id: string;
      incarnation: string;
      last_event_id: number;
    }>(IDLE_CONVERSATIONS_SQL, [cutoff.toISOString(), HOUR_ORIGIN, limit]);
    return rows.map((row) => ({
      tenantId: row.tenant_id,
      userId: row.user_id,
      conversationId: row.id,
      incarnation: row.incarnation,
      lastEventId: Number(row.last_event_id),
    }));
  }

  async deleteConversation(
    tenantId: string,
    conversationId: string,
    effects: DeletionEffects = {},
  ): Promise<boolean> {
    if (!isUuid(conversationId)) return false;
    return this.database.transaction(async (tx) => {
      // Its events go with it (ON DELETE CASCADE), in the same statement.
      const { rowCount } = await tx.query(
        `DELETE FROM conversations c
          WHERE ${oneConversation('c')}
            AND ($3::text IS NULL OR c.incarnation = $3::uuid)
            AND ($4::bigint IS NULL OR NOT EXISTS (
                  SELECT 1 FROM events e
                   WHERE e.conversation_id = $2 AND e.id > $4::bigint AND e.source = 'user'))`,
        [tenantId, conversationId, effects.incarnation ?? null, effects.idleThroughEventId ?? null],
      );
      if (rowCount === 0) return false;
      if (effects.erasureId !== undefined) {
        await tx.query(
          'UPDATE erasures SET conversations_deleted = conversations_deleted + 1 WHERE id = $1',
          [effects.erasureId],
        );
      }
      if (effects.audit) await insertAudit(tx, effects.audit, new Date());
      return true;
    });
  }

  async userConversations(
    tenantId: string,
    userId: string,
    limit: number,
    afterId?: string,
  ): Promise<ConversationRef[]> {
    // Through conversations_owner_idx (tenant_id, user_id), sorted: a user holds few.
    const { rows } = await this.database.query<{ id: string; incarnation: string }>(
      `SELECT id, incarnation FROM conversations
        WHERE tenant_id = $1 AND user_id = $2 AND ($4::uuid IS NULL OR id > $4::uuid)
        ORDER BY id
        LIMIT $3`,
      [tenantId, userId, limit, afterId ?? null],
    );
    return rows.map((row) => ({
      tenantId,
      userId,
      conversationId: row.id,
      incarnation: row.incarnation,
    }));
  }

  async startErasure(
    tenantId: string,
    userId: string,
    audit: Omit<AuditEntry, 'tenantId' | 'target'>,
    at: Date,
    lease: { owner: string; until: Date },
  ): Promise<{ erasure: ErasureRecord; created: boolean }> {
    // Two rounds: one that ran when we looked may be done by the insert.
    for (let round = 0; round < 2; round += 1) {
      const running = await this.runningErasure(tenantId, userId);
      if (running) return { erasure: running, created: false };
      try {
        const erasure = await this.database.transaction(async (tx) => {
          const { rows } = await tx.query<ErasureRow>(
            `INSERT INTO erasures (id, tenant_id, user_id, created_at, lease_owner, lease_until)
             VALUES ($1, $2, $3, $4::timestamptz, $5, $6::timestamptz)
             RETURNING ${ERASURE_COLUMNS}`,
            [
              randomUUID(),
              tenantId,
              userId,
              at.toISOString(),
              lease.owner,
              lease.until.toISOString(),
            ],
          );
          await insertAudit(tx, { ...audit, tenantId, target: `user:${userId}` }, at);
          return toErasure(rows[0]!);
        });
        return { erasure, created: true };
      } catch (error) {
        // Another request of the same erasure inserted first: answer with its id.
        if (sqlErrorCode(error) !== UNIQUE_VIOLATION) throw error;
      }
    }
    const running = await this.runningErasure(tenantId, userId);
    if (running) return { erasure: running, created: false };
    throw new Error('could not start the erasure');
  }

  private async runningErasure(tenantId: string, userId: string): Promise<ErasureRecord | null> {
    const { rows } = await this.database.query<ErasureRow>(
      `SELECT ${ERASURE_COLUMNS} FROM erasures
        WHERE tenant_id = $1 AND user_id = $2 AND status = 'running'`,
      [tenantId, userId],
    );
    return rows[0] ? toErasure(rows[0]) : null;
  }

  async getErasure(tenantId: string, id: string): Promise<ErasureRecord | null> {
    if (!isUuid(id)) return null;
    const { rows } = await this.database.query<ErasureRow>(
      `SELECT ${ERASURE_COLUMNS} FROM erasures WHERE tenant_id = $1 AND id = $2`,
      [tenantId, id],
    );
    return rows[0] ? toErasure(rows[0]) : null;
  }

  async claimErasure(
    owner: string,
    now: Date,
    until: Date,
    id?: string,
  ): Promise<ErasureRecord | null> {
    // SKIP LOCKED: two runners looking at once take different erasures.
    const { rows } = await this.database.query<ErasureRow>(
      `UPDATE erasures SET lease_owner = $1, lease_until = $3::timestamptz
        WHERE id = (
          SELECT id FROM erasures
           WHERE status = 'running'
             AND ($4::uuid IS NULL OR id = $4::uuid)
             AND (lease_until IS NULL OR lease_until < $2::timestamptz)
           ORDER BY lease_until NULLS FIRST
           LIMIT 1
           FOR UPDATE SKIP LOCKED)
          AND status = 'running'
        RETURNING ${ERASURE_COLUMNS}`,
      [owner, now.toISOString(), until.toISOString(), id ?? null],
    );
    return rows[0] ? toErasure(rows[0]) : null;
  }

  async renewErasure(id: string, owner: string, until: Date): Promise<boolean> {
    const { rowCount } = await this.database.query(
      `UPDATE erasures SET lease_until = $3::timestamptz
        WHERE id = $1 AND lease_owner = $2 AND status = 'running'`,
      [id, owner, until.toISOString()],
    );
    return rowCount > 0;
  }

  async finishErasure(id: string, owner: string, at: Date): Promise<boolean> {
    const { rowCount } = await this.database.query(
      `UPDATE erasures e
          SET status = 'done', user_id = NULL, finished_at = $3::timestamptz,
              lease_owner = NULL, lease_until = NULL
        WHERE e.id = $1 AND e.lease_owner = $2 AND e.status = 'running'
          AND NOT EXISTS (SELECT 1 FROM conversations c
                           WHERE c.tenant_id = e.tenant_id AND c.user_id = e.user_id)`,
      [id, owner, at.toISOString()],
    );
    return rowCount > 0;
  }

  async deleteUserState(tenantId: string, userId: string): Promise<void> {
    await this.database.query('DELETE FROM user_states WHERE tenant_id = $1 AND user_id = $2', [
      tenantId,
      userId,
    ]);
  }

  async getUserState(
    tenantId: string,
    appName: string,
    userId: string,
  ): Promise<Record<string, unknown>> {
    const { rows } = await this.database.query<{ state: Record<string, unknown> }>(
      'SELECT state FROM user_states WHERE tenant_id = $1 AND app_name = $2 AND user_id = $3',
      [tenantId, appName, userId],
    );
    return rows[0]?.state ?? {};
  }

  async deleteUserWebhookDeliveries(tenantId: string, userId: string): Promise<void> {
    await this.database.query(
      'DELETE FROM webhook_deliveries WHERE tenant_id = $1 AND user_id = $2',
      [tenantId, userId],
    );
  }

  /**
   * Moves the user's usage rows onto the user `erased`, added to what earlier
   * erasures moved there (one statement: the rows are never counted twice or
   * lost by a crash between the delete and the insert).
   */
  async eraseFromUsage(tenantId: string, userId: string): Promise<void> {
    if (userId === ERASED_USER) return;
    await this.database.query(
      `WITH moved AS (
         DELETE FROM model_usage WHERE tenant_id = $1 AND user_id = $2
         RETURNING day, model, conversation_id, prompt_tokens, completion_tokens, cost_usd, requests
       )
       INSERT INTO model_usage AS u
         (tenant_id, user_id, day, model, conversation_id,
          prompt_tokens, completion_tokens, cost_usd, requests)
       SELECT $1, $3, day, model, conversation_id,
              sum(prompt_tokens), sum(completion_tokens), sum(cost_usd), sum(requests)
         FROM moved GROUP BY day, model, conversation_id
       ON CONFLICT (tenant_id, user_id, day, model, conversation_id) DO UPDATE SET
         prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
         completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
         cost_usd = u.cost_usd + EXCLUDED.cost_usd,
         requests = u.requests + EXCLUDED.requests`,
      [tenantId, userId, ERASED_USER],
    );
  }

  async eraseFromAudit(tenantId: string, userId: string): Promise<void> {
    await this.database.query(
      `UPDATE audit_records
          SET actor = CASE WHEN actor = $2 THEN $3 ELSE actor END,
              target = CASE WHEN target = 'user:' || $2 THEN 'user:' || $3 ELSE target END
        WHERE tenant_id = $1 AND (actor = $2 OR target = 'user:' || $2)`,
      [tenantId, userId, ERASED_USER],
    );
  }

  async recordAudit(entry: AuditEntry, at: Date): Promise<void> {
    await insertAudit(this.database, entry, at);
  }

  async listAudit(tenantId: string, limit: number, cursor?: string): Promise<AuditPage> {
    if (cursor !== undefined && !AUDIT_CURSOR.test(cursor)) {
      throw new BadRequestError('invalid page_id', 'page_id');
    }
    // One row more than asked says whether another page exists.
    const { rows } = await this.database.query<{
      id: number | string;
      time: Date;
      actor: string;
      action: string;
      target: string;
    }>(
      `SELECT id, time, actor, action, target FROM audit_records
        WHERE tenant_id = $1 AND ($2::bigint IS NULL OR id < $2::bigint)
        ORDER BY id DESC
        LIMIT $3`,
      [tenantId, cursor ?? null, limit + 1],
    );
    const records = rows.slice(0, limit).map((row) => ({
      id: String(row.id),
      time: row.time,
      actor: row.actor,
      action: row.action,
      target: row.target,
    }));
    const last = records[records.length - 1];
    return { records, nextCursor: rows.length > limit && last ? last.id : null };
  }
}

async function insertAudit(db: SqlQueryable, entry: AuditEntry, at: Date): Promise<void> {
  await db.query(
    `INSERT INTO audit_records (tenant_id, time, actor, action, target)
     VALUES ($1, $2::timestamptz, $3, $4, $5)`,
    [entry.tenantId, at.toISOString(), entry.actor, entry.action, entry.target],
  );
}
