-- Conversations, their event logs and the app / user state scopes
-- (DESIGN.md "The data model"). Every query of the store filters by tenant_id.

CREATE TABLE conversations (
  id uuid PRIMARY KEY,
  tenant_id text NOT NULL,
  user_id text NOT NULL,
  app_name text NOT NULL,
  title text NOT NULL DEFAULT '',
  metadata jsonb NOT NULL DEFAULT '{}',
  -- { name, config }: the registry name of the agent and its options.
  agent jsonb NOT NULL,
  instructions text,
  status text NOT NULL DEFAULT 'STOPPED'
    CHECK (status IN ('STOPPED', 'STARTING', 'RUNNING', 'ERROR')),
  -- The agent_state of the last agent_state_changed observation; null before the first.
  agent_state text,
  -- The conversation-scoped state (keys without a scope prefix).
  state jsonb NOT NULL DEFAULT '{}',
  metrics jsonb NOT NULL
    DEFAULT '{"iterations": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0}',
  last_event_id bigint NOT NULL DEFAULT -1,
  -- Bumped by each new lease holder; writes carrying an older epoch are refused (fencing).
  lease_epoch bigint NOT NULL DEFAULT 0,
  lease_owner text,
  created_at timestamptz NOT NULL DEFAULT now(),
  -- Activity time: the last stored event or update.
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- Listing newest activity first with keyset pagination, per user and per tenant.
CREATE INDEX conversations_user_activity_idx
  ON conversations (tenant_id, user_id, updated_at DESC, id DESC);
CREATE INDEX conversations_tenant_activity_idx
  ON conversations (tenant_id, updated_at DESC, id DESC);
-- Few conversations run at a time: resetting them at start must not scan the table.
CREATE INDEX conversations_running_idx
  ON conversations (status) WHERE status IN ('STARTING', 'RUNNING');

CREATE TABLE events (
  conversation_id uuid NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
  -- The place in the conversation: 0, 1, 2, … without gaps.
  id bigint NOT NULL CHECK (id >= 0),
  tenant_id text NOT NULL,
  source text NOT NULL CHECK (source IN ('user', 'agent', 'environment')),
  -- The action or observation name.
  type text NOT NULL,
  -- The event body: { action, args, message } or { observation, content, extras, message }.
  payload jsonb NOT NULL,
  cause bigint,
  client_event_id text,
  -- The lease epoch of the worker that wrote it; null for user events.
  lease_epoch bigint,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (conversation_id, id)
);

-- Idempotency keys of user actions, one key space per conversation.
CREATE UNIQUE INDEX events_client_event_id_key
  ON events (conversation_id, client_event_id) WHERE client_event_id IS NOT NULL;

-- The `app:` scope, shared by every conversation of an app in a tenant.
CREATE TABLE app_states (
  tenant_id text NOT NULL,
  app_name text NOT NULL,
  state jsonb NOT NULL DEFAULT '{}',
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, app_name)
);

-- The `user:` scope, shared by every conversation of a user in an app.
CREATE TABLE user_states (
  tenant_id text NOT NULL,
  app_name text NOT NULL,
  user_id text NOT NULL,
  state jsonb NOT NULL DEFAULT '{}',
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, app_name, user_id)
);
