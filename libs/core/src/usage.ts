/**
 * Model usage as billed (docs/protocol.md "Usage and budgets"): every model
 * request's tokens and cost, kept per tenant, user, UTC day, model and
 * conversation. A step's usage rides on its first stored event (`EventDraft.usage`)
 * and is written in the same transaction as that event; reports sum it.
 */

/** What one step's model requests of one model used. */
export interface ModelUsageDelta {
  model: string;
  promptTokens: number;
  completionTokens: number;
  costUsd: number;
  /** Model requests counted (each usage an agent reported is one). */
  requests: number;
}

export const USAGE_GROUPS = ['day', 'user', 'model', 'conversation'] as const;
export type UsageGroup = (typeof USAGE_GROUPS)[number];

export interface UsageQuery {
  /** UTC days `YYYY-MM-DD`, both included. */
  from: string;
  to: string;
  groupBy: UsageGroup;
  /** Only this user's usage (always set for a caller who is not an admin). */
  userId?: string;
}

export interface UsageTotals {
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
  requests: number;
}

export interface UsageReport {
  results: Array<UsageTotals & { key: string }>;
  total: UsageTotals;
}

/** What the usage of a period added up to (a budget's spent base). */
export interface UsageScope {
  /** One user's (else the whole tenant's). */
  userId?: string;
  /** UTC days `YYYY-MM-DD`, both included. */
  from: string;
  to: string;
}

export const EMPTY_USAGE: UsageTotals = {
  prompt_tokens: 0,
  completion_tokens: 0,
  cost_usd: 0,
  requests: 0,
};

/** The UTC day (`YYYY-MM-DD`) of an ISO instant or a time in ms. */
export function utcDay(at: string | number): string {
  return (typeof at === 'number' ? new Date(at).toISOString() : at).slice(0, 10);
}

/** Adds the rows of a report into one: the in-memory store's and the tests' fold. */
export function addUsage(into: UsageTotals, add: UsageTotals): UsageTotals {
  return {
    prompt_tokens: into.prompt_tokens + add.prompt_tokens,
    completion_tokens: into.completion_tokens + add.completion_tokens,
    cost_usd: into.cost_usd + add.cost_usd,
    requests: into.requests + add.requests,
  };
}
