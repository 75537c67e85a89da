-- `events` hash-partitioned by conversation_id into 16 partitions
-- (PROTOCOL.md "Scale-out"). Every statement of the hot path names one
-- conversation, so Postgres prunes it to one partition at plan time (or at
-- executor start for a generic plan): each partition keeps its own smaller
-- indexes and vacuums on its own, and the layout is the one Citus shards by
-- (docs/scaling.md). The rows move as they are, every id and timestamp kept;
-- the table is locked while they are copied, so a large one is best migrated
-- by `npm run db:migrate` at a quiet time.
ALTER TABLE events RENAME TO events_unpartitioned;

CREATE TABLE events (
  conversation_id uuid NOT NULL,
  id bigint NOT NULL CHECK (id >= 0),
  tenant_id text NOT NULL,
  source text NOT NULL CHECK (source IN ('user', 'agent', 'environment')),
  type text NOT NULL,
  payload jsonb NOT NULL,
  cause bigint,
  client_event_id text,
  lease_epoch bigint,
  created_at timestamptz NOT NULL DEFAULT now(),
  size_bytes integer
) PARTITION BY HASH (conversation_id);

CREATE TABLE events_p00 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 0);
CREATE TABLE events_p01 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 1);
CREATE TABLE events_p02 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 2);
CREATE TABLE events_p03 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 3);
CREATE TABLE events_p04 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 4);
CREATE TABLE events_p05 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 5);
CREATE TABLE events_p06 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 6);
CREATE TABLE events_p07 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 7);
CREATE TABLE events_p08 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 8);
CREATE TABLE events_p09 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 9);
CREATE TABLE events_p10 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 10);
CREATE TABLE events_p11 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 11);
CREATE TABLE events_p12 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 12);
CREATE TABLE events_p13 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 13);
CREATE TABLE events_p14 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 14);
CREATE TABLE events_p15 PARTITION OF events FOR VALUES WITH (MODULUS 16, REMAINDER 15);

INSERT INTO events
  (conversation_id, id, tenant_id, source, type, payload, cause, client_event_id, lease_epoch,
   created_at, size_bytes)
SELECT conversation_id, id, tenant_id, source, type, payload, cause, client_event_id, lease_epoch,
       created_at, size_bytes
  FROM events_unpartitioned;

DROP TABLE events_unpartitioned;

-- Keys and indexes after the copy (cheaper than row by row); the names are
-- those of the table this one replaces.
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (conversation_id, id);
CREATE UNIQUE INDEX events_client_event_id_key
  ON events (conversation_id, client_event_id) WHERE client_event_id IS NOT NULL;
ALTER TABLE events ADD CONSTRAINT events_conversation_id_fkey
  FOREIGN KEY (conversation_id) REFERENCES conversations (id) ON DELETE CASCADE;
