-- A conversation id may be used again once its conversation is deleted (by
-- anyone). The incarnation tells the two apart: rooms, Redis channels and
-- appends name it, so that nothing of a deleted conversation (its sockets, its
-- streams, a send in flight) ever meets the one that reuses its id.
ALTER TABLE conversations ADD COLUMN incarnation uuid NOT NULL DEFAULT gen_random_uuid();
