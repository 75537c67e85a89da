-- A turn stores an agent_state_changed event as it starts and another as it
-- ends, and the events trigger of 0009 ran its function for each, to find
-- that neither `running` nor `awaiting_user_input` tells of anything: two
-- PL/pgSQL calls and two reads of the conversation per turn, in the append's
-- statement, whether webhooks are configured or not. The states that do
-- (error, calls awaiting approval) are now part of the trigger's condition,
-- which Postgres checks without calling the function.
DROP TRIGGER events_webhook ON events;
CREATE TRIGGER events_webhook
  AFTER INSERT ON events FOR EACH ROW
  WHEN (NEW.lease_epoch IS NOT NULL AND NEW.cause IS NOT NULL AND (
    (NEW.type = 'message' AND NEW.source = 'agent')
    OR (NEW.type = 'agent_state_changed'
        AND NEW.payload -> 'extras' ->> 'agent_state' IN ('error', 'awaiting_user_confirmation'))))
  EXECUTE FUNCTION cs_webhook_event_stored();
