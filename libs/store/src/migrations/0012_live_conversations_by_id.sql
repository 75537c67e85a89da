-- The worker's reconciler pages through the live (STARTING / RUNNING)
-- conversations in id order, looking for those whose job Redis lost. Keyed on
-- id, the partial index gives each page as a range of it (an index scan from
-- the last id seen, no sort of every live conversation per page); it serves
-- the standalone start-up reset as well as the index on status did. Its key
-- never changes, and entries move only when a status enters or leaves the
-- live set, as with the index it replaces: appends stay HOT updates.
DROP INDEX IF EXISTS conversations_running_idx;
CREATE INDEX conversations_live_idx
  ON conversations (id) WHERE status IN ('STARTING', 'RUNNING');
