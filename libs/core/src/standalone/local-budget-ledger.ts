/**
 * The standalone app's budget ledger: holds in this process' memory (it is
 * the only process of its database), with the same rules as the Redis
 * scripts of a cluster. A period's spent base is read from the usage table
 * the first time the period is used after a start, so a restart loses nothing
 * that was stored.
 */
import type { UsageScope } from '../usage.js';
import type { BudgetLedger, BudgetPeriod } from '../budgets/model-budget.js';

interface PeriodLedger {
  spent: number;
  holds: Map<string, { amount: number; expiresAt: number }>;
}

export class LocalBudgetLedger implements BudgetLedger {
  private readonly periods = new Map<string, { renewsAt: number; ledger: Promise<PeriodLedger> }>();

  constructor(
    private readonly usageCost: (tenantId: string, scope: UsageScope) => Promise<number>,
    private readonly now: () => number = Date.now,
  ) {}

  async hold(
    period: BudgetPeriod,
    holdId: string,
    amountUsd: number,
    holdTtlMs: number,
  ): Promise<boolean> {
    const ledger = await this.ledgerOf(period);
    // From here on synchronous: no other hold can come between the check and the hold.
    const now = this.now();
    let held = 0;
    for (const [id, hold] of ledger.holds) {
      if (hold.expiresAt <= now) ledger.holds.delete(id);
      else held += hold.amount;
    }
    if (ledger.spent >= period.limitUsd || ledger.spent + held + amountUsd > period.limitUsd) {
      return false;
    }
    ledger.holds.set(holdId, { amount: amountUsd, expiresAt: now + holdTtlMs });
    return true;
  }

  async settle(period: BudgetPeriod, holdId: string, costUsd: number): Promise<void> {
    const ledger = await this.ledgerOf(period);
    ledger.holds.delete(holdId);
    ledger.spent += costUsd;
  }

  async release(period: BudgetPeriod, holdId: string): Promise<void> {
    (await this.ledgerOf(period)).holds.delete(holdId);
  }

  private ledgerOf(period: BudgetPeriod): Promise<PeriodLedger> {
    const key = JSON.stringify([period.scope, period.tenantId, period.userId ?? null, period.id]);
    let ledger = this.periods.get(key)?.ledger;
    if (!ledger) {
      // Periods that have ended are done with.
      const now = this.now();
      for (const [other, entry] of this.periods) {
        if (entry.renewsAt <= now) this.periods.delete(other);
      }
      ledger = this.usageCost(period.tenantId, {
        from: period.from,
        to: period.to,
        ...(period.userId === undefined ? {} : { userId: period.userId }),
      }).then((spent) => ({ spent, holds: new Map() }));
      // A failed read is tried again by the next request.
      ledger.catch(() => this.periods.delete(key));
      this.periods.set(key, { renewsAt: period.renewsAt.getTime(), ledger });
    }
    return ledger;
  }
}
