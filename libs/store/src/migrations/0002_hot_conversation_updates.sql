-- Every append updates its conversation's row (last_event_id, updated_at,
-- agent_state, state, metrics). While updated_at was part of two indexes, none
-- of those updates could be HOT: each wrote new entries into every index of the
-- table and left dead ones behind, so under steady load the indexes bloated
-- and every lookup of a conversation got slower until autovacuum came by.
-- Without updated_at in an index (and with room left on each page), those
-- updates stay on their page and write no index entry. Lists read a user's or
-- a tenant's conversations through the owner index and sort them by activity.
DROP INDEX conversations_user_activity_idx;
DROP INDEX conversations_tenant_activity_idx;
CREATE INDEX conversations_owner_idx ON conversations (tenant_id, user_id);
ALTER TABLE conversations SET (fillfactor = 70);
