/**
 * The budget ledger of a cluster: one Redis hash per budget and period (a
 * user's day under the user's hash tag, a tenant's month under the tenant's),
 * changed only by `hold-budget-1.lua` and `settle-budget-1.lua`, so that a
 * hold is decided atomically against what every worker spent and holds. A
 * hold lapses by itself after its TTL (a worker that died holding it). The
 * spent base of a period comes from the usage table when the hash lacks it
 * (a new period, or a Redis that lost its data): the script says so, and is
 * called again with the sum read from Postgres.
 */
import type { BudgetLedger, BudgetPeriod, UsageScope } from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { runScript } from '../redis/lua-scripts.js';
import type { RedisConnection } from '../redis/redis-connections.js';

/** A period's hash outlives the period by this much (late settles), then goes. */
const KEY_GRACE_MS = 24 * 60 * 60 * 1000;

export class RedisBudgetLedger implements BudgetLedger {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly usageCost: (tenantId: string, scope: UsageScope) => Promise<number>,
  ) {}

  async hold(
    period: BudgetPeriod,
    holdId: string,
    amountUsd: number,
    holdTtlMs: number,
  ): Promise<boolean> {
    const key = this.keyOf(period);
    const keyTtlMs = Math.max(1, period.renewsAt.getTime() - Date.now()) + KEY_GRACE_MS;
    const args = [holdId, String(amountUsd), String(period.limitUsd), holdTtlMs, keyTtlMs];
    let answer = Number(await runScript(this.redis, 'hold-budget-1', [key], [...args, '']));
    if (answer === -1) {
      const spent = await this.usageCost(period.tenantId, {
        from: period.from,
        to: period.to,
        ...(period.userId === undefined ? {} : { userId: period.userId }),
      });
      answer = Number(
        await runScript(this.redis, 'hold-budget-1', [key], [...args, String(spent)]),
      );
    }
    return answer === 1;
  }

  async settle(period: BudgetPeriod, holdId: string, costUsd: number): Promise<void> {
    await runScript(this.redis, 'settle-budget-1', [this.keyOf(period)], [holdId, String(costUsd)]);
  }

  async release(period: BudgetPeriod, holdId: string): Promise<void> {
    await this.redis.hdel(this.keyOf(period), `h:${holdId}`);
  }

  private keyOf(period: BudgetPeriod): string {
    return period.userId === undefined
      ? this.keys.tenantBudget(period.tenantId, period.id)
      : this.keys.userBudget(period.tenantId, period.userId, period.id);
  }
}
