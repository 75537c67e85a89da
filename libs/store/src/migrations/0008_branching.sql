-- Branching (PROTOCOL.md "Branching: fork, rewind, edit, regenerate").
--
-- events.state_delta: the conversation-scope part of the state delta the
-- event carried (plain keys; a JSON null deletes a key), so that the state
-- as it was after any event can be rebuilt from the log (a fork's state, a
-- rewind's). Null when it carried none, and on events stored before this
-- migration (a rebuild does not see what they changed).
--
-- events.undone_by: the id of the rewind event that undid this one. An
-- undone event stays readable; no agent sees it again.
ALTER TABLE events
  ADD COLUMN state_delta jsonb,
  ADD COLUMN undone_by bigint;

-- A fork names where it came from (nothing is kept in step with the source:
-- it may be deleted).
ALTER TABLE conversations
  ADD COLUMN parent_conversation_id uuid,
  ADD COLUMN forked_from_event_id bigint;
