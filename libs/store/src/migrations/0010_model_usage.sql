-- Model usage as billed (PROTOCOL.md "Usage and budgets"): every model
-- request's tokens and cost, added up per tenant, user, UTC day, model and
-- conversation by an upsert in the transaction that stores the step the
-- usage belongs to. No foreign key: usage outlives its conversation (billing),
-- and its sums are the spent base of the budgets (USER_BUDGET_USD_PER_DAY,
-- TENANT_BUDGET_USD_PER_MONTH) whenever Redis has lost theirs.
CREATE TABLE model_usage (
  tenant_id text NOT NULL,
  user_id text NOT NULL,
  day date NOT NULL,
  model text NOT NULL,
  conversation_id uuid NOT NULL,
  prompt_tokens bigint NOT NULL DEFAULT 0,
  completion_tokens bigint NOT NULL DEFAULT 0,
  cost_usd numeric NOT NULL DEFAULT 0,
  requests bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, user_id, day, model, conversation_id)
);

-- A tenant's usage over days (an admin's report, the tenant's monthly budget).
CREATE INDEX model_usage_tenant_day ON model_usage (tenant_id, day);
