-- What the turn being answered has cost so far (MAX_BUDGET_PER_TASK_USD is
-- per turn): each append that carries a step's usage counts it here, in the
-- statement that stores the step, so that a new holder resuming the turn
-- (failover, restart) goes on counting from it instead of from 0.
ALTER TABLE conversations
  -- The user message whose turn is counted (its events' cause); null before any.
  ADD COLUMN turn_cause bigint,
  ADD COLUMN turn_cost_usd numeric NOT NULL DEFAULT 0;
