-- The agent runtime (PROTOCOL.md "Agents"): per-conversation settings, and
-- how far the conversation's user messages have been answered, so that a new
-- holder restores only the work still pending instead of the whole history.
ALTER TABLE conversations
  ADD COLUMN confirmation_mode boolean NOT NULL DEFAULT false,
  -- null: the deployment's MULTITASK_STRATEGY.
  ADD COLUMN multitask_strategy text
    CHECK (multitask_strategy IN ('enqueue', 'interrupt', 'reject')),
  -- Lower limits than the deployment's, or null.
  ADD COLUMN max_iterations integer,
  ADD COLUMN max_budget_usd numeric,
  -- Every user message up to this id has its turn settled (turns settle in id order).
  ADD COLUMN answered_through bigint NOT NULL DEFAULT -1;
