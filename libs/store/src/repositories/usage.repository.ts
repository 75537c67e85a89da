/**
 * SQL of `model_usage` (migration 0010): the upsert that adds a step's usage,
 * run in the transaction that stores the step, and the sums of the reports
 * and the budgets.
 */
import type { ModelUsageDelta, UsageQuery, UsageReport, UsageScope, UsageTotals } from '@cs/core';
import type { SqlQueryable } from '../database/sql-database.js';
import { PREPARED } from '../database/sql-database.js';

/** The column each grouping reads, as text (a fixed list: never from input). */
const GROUP_COLUMNS = {
  day: `to_char(day, 'YYYY-MM-DD')`,
  user: 'user_id',
  model: 'model',
  conversation: 'conversation_id::text',
} as const;

interface SumRow {
  key: string | null;
  prompt_tokens: string;
  completion_tokens: string;
  cost_usd: string;
  requests: string;
}

export class UsageRepository {
  constructor(private readonly db: SqlQueryable) {}

  /** Adds `usage` to its row of (tenant, user, day, model, conversation). */
  async add(
    tenantId: string,
    userId: string,
    conversationId: string,
    day: string,
    usage: ModelUsageDelta,
  ): Promise<void> {
    await this.db.query(
      `INSERT INTO model_usage AS u
         (tenant_id, user_id, day, model, conversation_id,
          prompt_tokens, completion_tokens, cost_usd, requests)
       VALUES ($1, $2, $3::date, $4, $5::uuid, $6::bigint, $7::bigint, $8::numeric, $9::bigint)
       ON CONFLICT (tenant_id, user_id, day, model, conversation_id) DO UPDATE
          SET prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
              completion_tokens = u.completion_tokens + excluded.completion_tokens,
              cost_usd = u.cost_usd + excluded.cost_usd,
              requests = u.requests + excluded.requests`,
      [
        tenantId,
        userId,
        day,
        usage.model,
        conversationId,
        Math.round(usage.promptTokens),
        Math.round(usage.completionTokens),
        usage.costUsd,
        usage.requests,
      ],
      PREPARED,
    );
  }

  async report(tenantId: string, query: UsageQuery): Promise<UsageReport> {
    const { rows } = await this.db.query<SumRow>(
      `SELECT ${GROUP_COLUMNS[query.groupBy]} AS key,
              sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
              sum(cost_usd) AS cost_usd, sum(requests) AS requests
         FROM model_usage
        WHERE tenant_id = $1 AND day BETWEEN $2::date AND $3::date
          AND ($4::text IS NULL OR user_id = $4)
        GROUP BY 1
        ORDER BY 1`,
      [tenantId, query.from, query.to, query.userId ?? null],
      PREPARED,
    );
    const results = rows.map((row) => ({ key: row.key ?? '', ...totalsOf(row) }));
    const total = results.reduce<UsageTotals>(
      (sum, row) => ({
        prompt_tokens: sum.prompt_tokens + row.prompt_tokens,
        completion_tokens: sum.completion_tokens + row.completion_tokens,
        cost_usd: sum.cost_usd + row.cost_usd,
        requests: sum.requests + row.requests,
      }),
      { prompt_tokens: 0, completion_tokens: 0, cost_usd: 0, requests: 0 },
    );
    return { results, total };
  }

  async cost(tenantId: string, scope: UsageScope): Promise<number> {
    const { rows } = await this.db.query<{ cost_usd: string | null }>(
      `SELECT sum(cost_usd) AS cost_usd
         FROM model_usage
        WHERE tenant_id = $1 AND day BETWEEN $2::date AND $3::date
          AND ($4::text IS NULL OR user_id = $4)`,
      [tenantId, scope.from, scope.to, scope.userId ?? null],
      PREPARED,
    );
    return Number(rows[0]?.cost_usd ?? 0);
  }
}

function totalsOf(row: SumRow): UsageTotals {
  return {
    prompt_tokens: Number(row.prompt_tokens),
    completion_tokens: Number(row.completion_tokens),
    cost_usd: Number(row.cost_usd),
    requests: Number(row.requests),
  };
}
