-- Data lifecycle (PROTOCOL.md "Data lifecycle"): retention, erasure of a
-- user, and the audit trail.

-- Retention looks for conversations idle since a time. An index on
-- updated_at would cost every append its HOT update (0002): each append moves
-- updated_at. The hour of the last activity moves once an hour at most, and an
-- update that leaves an indexed value as it was stays HOT, so this index
-- costs an active conversation one index entry an hour. The sweep reads the
-- hours up to the cutoff's through it and checks updated_at on those rows only.
-- (Adding a stored column rewrites the table once.)
ALTER TABLE conversations
  ADD COLUMN activity_hour timestamptz
  GENERATED ALWAYS AS (date_bin('1 hour', updated_at, timestamptz '2000-01-01 00:00:00+00')) STORED;
CREATE INDEX conversations_activity_hour_idx ON conversations (activity_hour);

-- One erasure of a user: a stored job that any gateway (or the standalone
-- process) runs, resumes after a crash (its lease expired), and that ends
-- `done`. At most one runs per user of a tenant. The user id goes once it is
-- done: nothing of the user stays.
CREATE TABLE erasures (
  id uuid PRIMARY KEY,
  tenant_id text NOT NULL,
  user_id text,
  status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done')),
  conversations_deleted integer NOT NULL DEFAULT 0,
  -- Who runs it, until when; a lease past its time is anyone's to take.
  lease_owner text,
  lease_until timestamptz,
  created_at timestamptz NOT NULL,
  finished_at timestamptz
);
CREATE UNIQUE INDEX erasures_running_user_key
  ON erasures (tenant_id, user_id) WHERE status = 'running';
CREATE INDEX erasures_running_idx ON erasures (lease_until) WHERE status = 'running';

-- Who did what to whose data, newest first per tenant. An erasure replaces
-- the erased user's id in it (as actor or in a target) by `erased`.
CREATE TABLE audit_records (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id text NOT NULL,
  time timestamptz NOT NULL,
  actor text NOT NULL,
  action text NOT NULL,
  target text NOT NULL
);
CREATE INDEX audit_records_tenant_idx ON audit_records (tenant_id, id DESC);
