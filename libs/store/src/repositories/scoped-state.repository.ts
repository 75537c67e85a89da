/**
 * SQL of the `app:` and `user:` state scopes. Many conversations of one user
 * (or app) write the same row at once, so each write merges its keys in SQL
 * under the row lock of the upsert; none reads the state and writes it back.
 */
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';

export class ScopedStateRepository {
  constructor(private readonly db: SqlQueryable) {}

  /** The app's and the user's state in the app (`{}` for one never written). */
  async find(
    tenantId: string,
    appName: string,
    userId: string,
  ): Promise<{ app: Record<string, unknown>; user: Record<string, unknown> }> {
    const { rows } = await this.db.query<{
      app_state: Record<string, unknown> | null;
      user_state: Record<string, unknown> | null;
    }>(
      `SELECT (SELECT state FROM app_states
                WHERE tenant_id = $1 AND app_name = $2) AS app_state,
              (SELECT state FROM user_states
                WHERE tenant_id = $1 AND app_name = $2 AND user_id = $3) AS user_state`,
      [tenantId, appName, userId],
      PREPARED,
    );
    const row = rows[0];
    return { app: row?.app_state ?? {}, user: row?.user_state ?? {} };
  }

  /** Sets the keys of `set` (a JSON object) and removes those of `deleted`, at `at` (ISO text). */
  async mergeUserState(
    tenantId: string,
    appName: string,
    userId: string,
    set: string,
    deleted: readonly string[],
    at: string,
  ): Promise<void> {
    await this.db.query(
      `INSERT INTO user_states AS s (tenant_id, app_name, user_id, state, updated_at)
       VALUES ($1, $2, $3, $4::jsonb - $5::text[], $6::timestamptz)
       ON CONFLICT (tenant_id, app_name, user_id) DO UPDATE
         SET state = (s.state || $4::jsonb) - $5::text[], updated_at = $6::timestamptz`,
      [tenantId, appName, userId, set, deleted, at],
      PREPARED,
    );
  }

  async mergeAppState(
    tenantId: string,
    appName: string,
    set: string,
    deleted: readonly string[],
    at: string,
  ): Promise<void> {
    await this.db.query(
      `INSERT INTO app_states AS s (tenant_id, app_name, state, updated_at)
       VALUES ($1, $2, $3::jsonb - $4::text[], $5::timestamptz)
       ON CONFLICT (tenant_id, app_name) DO UPDATE
         SET state = (s.state || $3::jsonb) - $4::text[], updated_at = $5::timestamptz`,
      [tenantId, appName, set, deleted, at],
      PREPARED,
    );
  }
}
