import { describe, expect, it } from 'vitest';
import type { UsageScope } from '../usage.js';
import { LocalBudgetLedger } from '../standalone/local-budget-ledger.js';
import {
  BudgetExhaustedError,
  budgetPeriods,
  modelBudget,
  UNLIMITED_BUDGET,
} from './model-budget.js';

const owner = { tenantId: 't', userId: 'u' };
const NOON = Date.UTC(2026, 11, 6, 12);

function budget(
  limits: { userUsdPerDay: number; tenantUsdPerMonth: number },
  spent: (tenantId: string, scope: UsageScope) => number = () => 0,
  clock = { now: NOON },
) {
  const rejected: string[] = [];
  const seeds: UsageScope[] = [];
  const ledger = new LocalBudgetLedger(
    (tenantId, scope) => {
      seeds.push(scope);
      return Promise.resolve(spent(tenantId, scope));
    },
    () => clock.now,
  );
  const subject = modelBudget({
    limits,
    ledger,
    holdTtlMs: 1000,
    onRejected: (scope) => rejected.push(scope),
    now: () => clock.now,
  });
  return { subject, rejected, seeds, clock };
}

describe('budgetPeriods', () => {
  it("gives the user's UTC day and the tenant's UTC month, with when each renews", () => {
    const [day, month] = budgetPeriods(
      { userUsdPerDay: 1, tenantUsdPerMonth: 10 },
      owner,
      Date.UTC(2026, 11, 31, 23, 59),
    );
    expect(day).toMatchObject({
      scope: 'user',
      id: '2026-12-31',
      from: '2026-12-31',
      to: '2026-12-31',
    });
    expect(day!.renewsAt.toISOString()).toBe('2027-01-01T00:00:00.000Z');
    expect(month).toMatchObject({
      scope: 'tenant',
      id: '2026-12',
      from: '2026-12-01',
      to: '2026-12-31',
    });
    expect(month!.userId).toBeUndefined();
    expect(month!.renewsAt.toISOString()).toBe('2027-01-01T00:00:00.000Z');
    expect(budgetPeriods({ userUsdPerDay: 0, tenantUsdPerMonth: 0 }, owner, NOON)).toEqual([]);
  });
});

describe(modelBudget.name, () => {
  it('is unlimited without a budget', () => {
    expect(
      modelBudget({
        limits: { userUsdPerDay: 0, tenantUsdPerMonth: 0 },
        ledger: {} as never,
        holdTtlMs: 1,
      }),
    ).toBe(UNLIMITED_BUDGET);
  });

  it('lets through only what fits when many requests hold at once', async () => {
    const { subject, rejected } = budget({ userUsdPerDay: 5.5, tenantUsdPerMonth: 0 });
    const outcomes = await Promise.allSettled(
      Array.from({ length: 20 }, () => subject.reserve({ ...owner, worstCaseUsd: 1 })),
    );
    expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(5);
    const refused = outcomes.find((o) => o.status === 'rejected');
    expect((refused as PromiseRejectedResult).reason).toBeInstanceOf(BudgetExhaustedError);
    expect(String((refused as PromiseRejectedResult).reason.message)).toMatch(
      /daily model budget \(USD 5.5 per UTC day\).*renews at 2026-12-07T00:00:00.000Z/,
    );
    expect(rejected).toHaveLength(15);
    expect(new Set(rejected)).toEqual(new Set(['user']));
  });

  it('counts what was settled, frees what was released, and lets lapsed holds go', async () => {
    const { subject, clock } = budget({ userUsdPerDay: 2, tenantUsdPerMonth: 0 });
    const first = await subject.reserve({ ...owner, worstCaseUsd: 1.5 });
    await expect(subject.reserve({ ...owner, worstCaseUsd: 1 })).rejects.toBeInstanceOf(
      BudgetExhaustedError,
    );
    await first.settle(0.5);
    const second = await subject.reserve({ ...owner, worstCaseUsd: 1.5 });
    await second.release();
    const third = await subject.reserve({ ...owner, worstCaseUsd: 1.5 });
    void third; // a worker that died holding it
    await expect(subject.reserve({ ...owner, worstCaseUsd: 1 })).rejects.toBeInstanceOf(
      BudgetExhaustedError,
    );
    clock.now += 1001;
    await subject.reserve({ ...owner, worstCaseUsd: 1.5 });
  });

  it("releases the user's hold when the tenant's budget refuses", async () => {
    const { subject, rejected } = budget({ userUsdPerDay: 2.5, tenantUsdPerMonth: 2 });
    await expect(subject.reserve({ ...owner, worstCaseUsd: 2.2 })).rejects.toMatchObject({
      period: { scope: 'tenant' },
    });
    expect(rejected).toEqual(['tenant']);
    // Had the user's hold of 2.2 stayed, 1.5 more would not fit the user's 2.5.
    await subject.reserve({ ...owner, worstCaseUsd: 1.5 });
  });

  it('starts from what the usage table says was spent, read once per period', async () => {
    const { subject, seeds } = budget({ userUsdPerDay: 3, tenantUsdPerMonth: 50 }, (_t, scope) =>
      scope.userId === undefined ? 49.5 : 2.5,
    );
    await expect(subject.reserve({ ...owner, worstCaseUsd: 0.6 })).rejects.toMatchObject({
      period: { scope: 'user' },
    });
    await subject.reserve({ ...owner, worstCaseUsd: 0.4 });
    await expect(
      subject.reserve({ tenantId: 't', userId: 'other', worstCaseUsd: 0.2 }),
    ).rejects.toMatchObject({
      period: { scope: 'tenant' },
    });
    expect(seeds).toContainEqual({ from: '2026-12-06', to: '2026-12-06', userId: 'u' });
    expect(seeds).toContainEqual({ from: '2026-12-01', to: '2026-12-31' });
    expect(seeds.filter((s) => s.userId === 'u')).toHaveLength(1);
  });
});
