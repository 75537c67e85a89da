/**
 * Budgets of model spending (docs/protocol.md "Usage and budgets"): with
 * `USER_BUDGET_USD_PER_DAY` or `TENANT_BUDGET_USD_PER_MONTH`, each model
 * request's worst case is held against every budget of its user and tenant
 * before it is sent, and the hold is settled with what the request cost
 * after it (or released when it failed). A request that does not fit is not
 * sent: `BudgetExhaustedError` says which budget and when it renews.
 *
 * The rules are here; where the holds live is a `BudgetLedger`: Redis (one
 * hash per budget and period, changed only by Lua scripts: libs/cluster) for
 * a cluster, this process' memory for the standalone app. Either way a
 * ledger that has no spent base for a period (a new period, a Redis that lost
 * its data, a restarted standalone process) takes it from the usage table
 * (`ConversationStore.usageCost`) before it holds anything, so that what was
 * spent survives the loss of the ledger.
 */
export type BudgetScope = 'user' | 'tenant';

export interface BudgetLimits {
  /** `USER_BUDGET_USD_PER_DAY` (0: none). */
  userUsdPerDay: number;
  /** `TENANT_BUDGET_USD_PER_MONTH` (0: none). */
  tenantUsdPerMonth: number;
}

/** One budget of one owner over one period. */
export interface BudgetPeriod {
  scope: BudgetScope;
  tenantId: string;
  /** The user's budget's user; undefined for the tenant's. */
  userId: string | undefined;
  limitUsd: number;
  /** `YYYY-MM-DD` (a user's day) or `YYYY-MM` (a tenant's month), UTC. */
  id: string;
  /** Its UTC days, both included (what `usageCost` sums for its spent base). */
  from: string;
  to: string;
  /** When the next period starts. */
  renewsAt: Date;
}

/** Where holds live: every call is atomic for its period, across every process that shares it. */
export interface BudgetLedger {
  /**
   * Holds `amountUsd` for `holdId` if what was spent and is held in the
   * period, with it, stays within its limit; false (nothing held) otherwise.
   * A hold lapses after `holdTtlMs` unless settled or released first.
   */
  hold(
    period: BudgetPeriod,
    holdId: string,
    amountUsd: number,
    holdTtlMs: number,
  ): Promise<boolean>;
  /** Ends the hold and counts `costUsd` as spent. */
  settle(period: BudgetPeriod, holdId: string, costUsd: number): Promise<void>;
  /** Ends the hold; nothing is spent. */
  release(period: BudgetPeriod, holdId: string): Promise<void>;
}

/** A model request's place in the budgets: settled or released exactly once. */
export interface BudgetHold {
  settle(costUsd: number): Promise<void>;
  release(): Promise<void>;
}

export interface ModelBudget {
  /** Holds `worstCaseUsd` in every budget of the owner, or throws `BudgetExhaustedError`. */
  reserve(request: { tenantId: string; userId: string; worstCaseUsd: number }): Promise<BudgetHold>;
}

const NOTHING_HELD: BudgetHold = {
  settle: () => Promise.resolve(),
  release: () => Promise.resolve(),
};

/** No budget configured: nothing is held, nothing refused. */
export const UNLIMITED_BUDGET: ModelBudget = { reserve: () => Promise.resolve(NOTHING_HELD) };

export class BudgetExhaustedError extends Error {
  constructor(readonly period: BudgetPeriod) {
    const what =
      period.scope === 'user'
        ? `your daily model budget (USD ${period.limitUsd} per UTC day)`
        : `your organization's monthly model budget (USD ${period.limitUsd} per UTC month)`;
    super(`${what} is used up; it renews at ${period.renewsAt.toISOString()}`);
    this.name = 'BudgetExhaustedError';
  }
}

/** The budgets of a user and its tenant in force at `now` (ms), user's first. */
export function budgetPeriods(
  limits: BudgetLimits,
  owner: { tenantId: string; userId: string },
  now: number,
): BudgetPeriod[] {
  const at = new Date(now);
  const year = at.getUTCFullYear();
  const month = at.getUTCMonth();
  const day = at.toISOString().slice(0, 10);
  const periods: BudgetPeriod[] = [];
  if (limits.userUsdPerDay > 0) {
    periods.push({
      scope: 'user',
      tenantId: owner.tenantId,
      userId: owner.userId,
      limitUsd: limits.userUsdPerDay,
      id: day,
      from: day,
      to: day,
      renewsAt: new Date(Date.UTC(year, month, at.getUTCDate() + 1)),
    });
  }
  if (limits.tenantUsdPerMonth > 0) {
    const last = new Date(Date.UTC(year, month + 1, 0)).toISOString().slice(0, 10);
    periods.push({
      scope: 'tenant',
      tenantId: owner.tenantId,
      userId: undefined,
      limitUsd: limits.tenantUsdPerMonth,
      id: day.slice(0, 7),
      from: `${day.slice(0, 7)}-01`,
      to: last,
      renewsAt: new Date(Date.UTC(year, month + 1, 1)),
    });
  }
  return periods;
}

export interface BudgetOptions {
  limits: BudgetLimits;
  ledger: BudgetLedger;
  /** How long a hold outlives a worker that died holding it (a model request's timeout, and some). */
  holdTtlMs: number;
  /** Told each refusal (`cs_budget_rejections_total{scope}`). */
  onRejected?: (scope: BudgetScope) => void;
  now?: () => number;
}

/**
 * The budgets of a deployment: holds in the user's budget, then the
 * tenant's, each on its own key (one slot each on a Redis Cluster); when the
 * second refuses, the first is released. Concurrent requests never spend
 * past a budget: each hold is decided atomically against what is spent and
 * held; a refusal in between only ever refuses more, never less.
 */
export function modelBudget(options: BudgetOptions): ModelBudget {
  const { limits, ledger, holdTtlMs } = options;
  if (limits.userUsdPerDay <= 0 && limits.tenantUsdPerMonth <= 0) return UNLIMITED_BUDGET;
  const now = options.now ?? Date.now;
  return {
    async reserve(request) {
      const holdId = crypto.randomUUID();
      const amount = Math.max(0, request.worstCaseUsd);
      const held: BudgetPeriod[] = [];
      const releaseHeld = () =>
        Promise.all(held.map((period) => ledger.release(period, holdId))).then(() => undefined);
      for (const period of budgetPeriods(limits, request, now())) {
        let fits: boolean;
        try {
          fits = await ledger.hold(period, holdId, amount, holdTtlMs);
        } catch (error) {
          await releaseHeld().catch(() => undefined);
          throw error;
        }
        if (!fits) {
          await releaseHeld().catch(() => undefined);
          options.onRejected?.(period.scope);
          throw new BudgetExhaustedError(period);
        }
        held.push(period);
      }
      let done = false;
      return {
        async settle(costUsd) {
          if (done) return;
          done = true;
          const cost = Number.isFinite(costUsd) && costUsd > 0 ? costUsd : 0;
          await Promise.all(held.map((period) => ledger.settle(period, holdId, cost)));
        },
        async release() {
          if (done) return;
          done = true;
          await releaseHeld();
        },
      };
    },
  };
}
