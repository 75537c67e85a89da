-- Webhooks from a transactional outbox (PROTOCOL.md "Webhooks"). A delivery
-- row per (message, matching endpoint) is written by triggers, in the
-- statement that stores what causes it: every write path (the batched and
-- the single appends, creation, deletion, every status write) gets it in the
-- same transaction without knowing of webhooks, so that no process death
-- loses or invents a delivery.

-- The endpoints of WEBHOOKS without their secrets (which stay in the
-- processes' configuration), written by every process at start
-- (`WebhookOutbox.syncEndpoints`). With none, the triggers write nothing.
-- On Citus: a reference table.
CREATE TABLE webhook_endpoints (
  url text PRIMARY KEY,
  -- The message types sent to it; null: all.
  events text[],
  -- The tenants whose messages it receives; null: all.
  tenants text[]
);

-- One message to one endpoint. Order per (conversation, endpoint) is `seq`:
-- every write that enqueues holds its conversation's row lock, so seq grows
-- along a conversation in commit order. Only the oldest pending delivery of a
-- (conversation, endpoint) is handed out; other conversations never wait.
-- Carries conversation_id first in its key: distributed by it on Citus,
-- co-located with conversations and events.
CREATE TABLE webhook_deliveries (
  conversation_id uuid NOT NULL,
  endpoint_url text NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  -- The webhook-id: the same on every attempt.
  id uuid NOT NULL DEFAULT gen_random_uuid(),
  tenant_id text NOT NULL,
  user_id text NOT NULL,
  type text NOT NULL,
  -- The body's timestamp: when what it tells happened.
  occurred_at timestamptz NOT NULL,
  -- The body's data besides tenant_id, user_id and conversation_id.
  data jsonb NOT NULL,
  status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts integer NOT NULL DEFAULT 0,
  -- When the next attempt is due; null: at once. Set from the dispatchers'
  -- clock, which claims compare against (never the database's now()).
  next_attempt_at timestamptz,
  -- A dispatcher's claim on the attempt in flight; past claimed_until
  -- (the process died) another dispatcher takes it over.
  claim uuid,
  claimed_until timestamptz,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  delivered_at timestamptz,
  PRIMARY KEY (conversation_id, endpoint_url, seq)
);
-- The head of each (conversation, endpoint) among the pending ones.
CREATE INDEX webhook_deliveries_pending_idx
  ON webhook_deliveries (conversation_id, endpoint_url, seq) WHERE status = 'pending';
-- The admin routes: one delivery by id, a tenant's newest first.
CREATE INDEX webhook_deliveries_id_idx ON webhook_deliveries (id);
CREATE INDEX webhook_deliveries_tenant_idx ON webhook_deliveries (tenant_id, seq DESC);
CREATE INDEX webhook_deliveries_tenant_status_idx
  ON webhook_deliveries (tenant_id, status, seq DESC);

-- What the turn being counted (turn_cause) has used in tokens, kept beside
-- its turn_cost_usd for turn.completed's data.usage: a metrics change adds
-- to it, a new turn_cause starts it afresh. Maintained by a trigger so that
-- the append statements stay as they are.
ALTER TABLE conversations
  ADD COLUMN turn_prompt_tokens numeric NOT NULL DEFAULT 0,
  ADD COLUMN turn_completion_tokens numeric NOT NULL DEFAULT 0;

CREATE FUNCTION cs_count_turn_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  prompt numeric := coalesce((NEW.metrics ->> 'prompt_tokens')::numeric, 0)
    - coalesce((OLD.metrics ->> 'prompt_tokens')::numeric, 0);
  completion numeric := coalesce((NEW.metrics ->> 'completion_tokens')::numeric, 0)
    - coalesce((OLD.metrics ->> 'completion_tokens')::numeric, 0);
BEGIN
  IF NEW.turn_cause IS DISTINCT FROM OLD.turn_cause THEN
    NEW.turn_prompt_tokens := prompt;
    NEW.turn_completion_tokens := completion;
  ELSE
    NEW.turn_prompt_tokens := OLD.turn_prompt_tokens + prompt;
    NEW.turn_completion_tokens := OLD.turn_completion_tokens + completion;
  END IF;
  RETURN NEW;
END $$;

CREATE TRIGGER conversations_turn_tokens
  BEFORE UPDATE ON conversations FOR EACH ROW
  WHEN (OLD.metrics IS DISTINCT FROM NEW.metrics OR OLD.turn_cause IS DISTINCT FROM NEW.turn_cause)
  EXECUTE FUNCTION cs_count_turn_tokens();

-- One message to every endpoint that takes its type and tenant.
CREATE FUNCTION cs_webhook_enqueue(
  p_conversation uuid, p_tenant text, p_user text, p_type text, p_at timestamptz, p_data jsonb
) RETURNS void LANGUAGE sql AS $$
  INSERT INTO webhook_deliveries
    (conversation_id, endpoint_url, tenant_id, user_id, type, occurred_at, data)
  SELECT p_conversation, e.url, p_tenant, p_user, p_type, p_at, p_data
    FROM webhook_endpoints e
   WHERE (e.events IS NULL OR p_type = ANY (e.events))
     AND (e.tenants IS NULL OR p_tenant = ANY (e.tenants))
   ORDER BY e.url
$$;

CREATE FUNCTION cs_webhook_conversation_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    PERFORM cs_webhook_enqueue(NEW.id, NEW.tenant_id, NEW.user_id, 'conversation.created',
      NEW.created_at, jsonb_build_object('title', NEW.title, 'status', NEW.status));
  ELSIF TG_OP = 'DELETE' THEN
    PERFORM cs_webhook_enqueue(OLD.id, OLD.tenant_id, OLD.user_id, 'conversation.deleted',
      now(), '{}'::jsonb);
  ELSE
    PERFORM cs_webhook_enqueue(NEW.id, NEW.tenant_id, NEW.user_id, 'conversation.status_changed',
      now(), jsonb_build_object('status', NEW.status, 'previous_status', OLD.status));
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER conversations_webhook_created
  AFTER INSERT ON conversations FOR EACH ROW
  EXECUTE FUNCTION cs_webhook_conversation_changed();
CREATE TRIGGER conversations_webhook_deleted
  AFTER DELETE ON conversations FOR EACH ROW
  EXECUTE FUNCTION cs_webhook_conversation_changed();
CREATE TRIGGER conversations_webhook_status
  AFTER UPDATE OF status ON conversations FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION cs_webhook_conversation_changed();

-- Turns: an agent's answer (not cut short), an error, a call awaiting
-- approval. Only what an agent session wrote (under a lease epoch): history
-- imported with replay_json or copied by a fork tells of nothing new.
CREATE FUNCTION cs_webhook_event_stored() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  conv record;
  agent_state text;
  calls jsonb;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM webhook_endpoints) THEN
    RETURN NULL;
  END IF;
  SELECT c.user_id, c.turn_cause, c.turn_cost_usd, c.turn_prompt_tokens, c.turn_completion_tokens,
         c.forked_from_event_id
    INTO conv
    FROM conversations c
   WHERE c.id = NEW.conversation_id;
  -- A fork's copy of its source's events (they keep their lease epochs).
  IF NOT FOUND OR NEW.id <= coalesce(conv.forked_from_event_id, -1) THEN
    RETURN NULL;
  END IF;
  IF NEW.type = 'message' THEN
    IF coalesce(NEW.payload -> 'args' ->> 'interrupted', 'false') = 'true' THEN
      RETURN NULL;
    END IF;
    PERFORM cs_webhook_enqueue(NEW.conversation_id, NEW.tenant_id, conv.user_id, 'turn.completed',
      NEW.created_at, jsonb_build_object(
        'event_id', NEW.cause,
        'answer_event_id', NEW.id,
        'content', NEW.payload -> 'args' -> 'content',
        'usage', CASE WHEN conv.turn_cause = NEW.cause
          THEN jsonb_build_object('prompt_tokens', conv.turn_prompt_tokens,
                 'completion_tokens', conv.turn_completion_tokens,
                 'cost_usd', conv.turn_cost_usd)
          ELSE '{"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0}'::jsonb END));
    RETURN NULL;
  END IF;
  agent_state := NEW.payload -> 'extras' ->> 'agent_state';
  IF agent_state = 'error' THEN
    PERFORM cs_webhook_enqueue(NEW.conversation_id, NEW.tenant_id, conv.user_id, 'turn.failed',
      NEW.created_at, jsonb_build_object(
        'event_id', NEW.cause, 'reason', NEW.payload -> 'extras' -> 'reason'));
  ELSIF agent_state = 'awaiting_user_confirmation' THEN
    -- The turn's calls still without a result, stored between its message and now.
    SELECT jsonb_agg(jsonb_build_object(
             'tool', e.payload -> 'args' -> 'tool',
             'arguments', e.payload -> 'args' -> 'arguments',
             'tool_call_id', e.payload -> 'args' -> 'tool_call_id',
             'event_id', e.id) ORDER BY e.id)
      INTO calls
      FROM events e
     WHERE e.conversation_id = NEW.conversation_id
       AND e.id > NEW.cause AND e.id < NEW.id
       AND e.type = 'tool_call' AND e.cause = NEW.cause
       AND NOT EXISTS (
         SELECT 1 FROM events r
          WHERE r.conversation_id = NEW.conversation_id
            AND r.id > e.id AND r.id < NEW.id
            AND r.type = 'tool_result' AND r.cause = e.id);
    IF calls IS NOT NULL THEN
      PERFORM cs_webhook_enqueue(NEW.conversation_id, NEW.tenant_id, conv.user_id,
        'approval.requested', NEW.created_at,
        jsonb_build_object('event_id', NEW.cause, 'tool_calls', calls));
    END IF;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER events_webhook
  AFTER INSERT ON events FOR EACH ROW
  WHEN (NEW.lease_epoch IS NOT NULL AND NEW.cause IS NOT NULL AND (
    (NEW.type = 'message' AND NEW.source = 'agent') OR NEW.type = 'agent_state_changed'))
  EXECUTE FUNCTION cs_webhook_event_stored();
