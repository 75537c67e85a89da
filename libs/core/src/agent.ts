/**
 * The agent contract (docs/protocol.md "Agents", "Agent modules"): an agent is
 * `{ step(context) }`, yielding agent outputs for one step of a turn; the
 * runtime (`AgentSession`) stores them, runs the tool calls and starts the
 * next step. Agents hold nothing between steps: what they need is in the
 * context (the history is read from the store as asked).
 */
import type {
  AgentOutput,
  StatusUpdate,
  StoredEvent,
  ToolDescription,
  TurnErrorReason,
} from '@cs/protocol';
import type { AgentSpec } from './conversation.js';

/** The conversation's stored events, read from the store as asked (a small cache aside). */
export interface ConversationHistory {
  /** The id of the last event the agent may see. */
  readonly last_event_id: number;
  /** The last `limit` events it may see, oldest first. */
  recent(limit: number): Promise<StoredEvent[]>;
  /** Its events `start_id` … `end_id` (both inclusive, as in REST), oldest first. */
  range(start_id: number, end_id: number): AsyncIterable<StoredEvent>;
}

/** What an agent is given for one step. */
export interface AgentContext {
  conversation_id: string;
  tenant_id: string;
  user_id: string;
  /** The user message the turn answers. */
  trigger: StoredEvent;
  /** The merged session state (`app:` and `user:` keys with their prefix, plain keys, `temp:` keys). */
  state: Readonly<Record<string, unknown>>;
  /** The conversation's instructions (system prompt), if any. */
  instructions: string | null;
  /** The tools the runtime runs for it. */
  tools: readonly ToolDescription[];
  /** Aborted on stop, pause, interrupt, lease loss and shutdown. */
  signal: AbortSignal;
  /**
   * Everything the agent may see: up to the trigger, earlier turns' answers,
   * and what this turn's steps stored (never messages queued behind it).
   */
  history: ConversationHistory;
  /** The step's number in the turn, from 1. */
  step: number;
  /** Sends a status update to the conversation's room (not stored); for built-in agents. */
  notify?(status: Omit<StatusUpdate, 'status_update'>): void;
}

/** An agent: each step yields its outputs. */
export interface Agent {
  step(context: AgentContext): AsyncIterable<AgentOutput>;
  /**
   * Optional: a short title for an untitled conversation after its first
   * answer (the `llm` agent asks its model); the fallback rule applies when
   * absent, or when it throws.
   */
  title?(context: AgentContext): Promise<{
    title: string;
    usage?: { prompt_tokens: number; completion_tokens: number; cost_usd?: number };
  }>;
}

/**
 * Thrown by an agent whose turn cannot go on for a reason of the contract
 * (`llm_error`, `agent_http_error`): its `safeMessage` is what users see,
 * its `cause` what the logs get.
 */
export class AgentTurnError extends Error {
  constructor(
    readonly reason: TurnErrorReason,
    readonly safeMessage: string,
    options?: { cause?: unknown },
  ) {
    super(safeMessage, options);
    this.name = 'AgentTurnError';
  }
}

/** Makes agents by name (`AGENT`, a conversation's `agent` field). */
export interface AgentFactory {
  has(name: string): boolean;
  create(spec: AgentSpec): Agent;
  /** Throws `BadRequestError` (field `agent_config…`) for a config the agent cannot run with. */
  validateConfig?(name: string, config: Record<string, unknown>): void;
}

/** What a tool's `run` gets besides its arguments. */
export interface ToolRunContext {
  signal: AbortSignal;
  /**
   * `<conversation_id>:<id of the stored tool call>`: unique across calls and
   * conversations (an agent's `tool_call_id`s may repeat), and the same when
   * a call is run again after a failover.
   */
  idempotency_key: string;
  conversation_id: string;
}

/** A tool of an agent module (docs/protocol.md "Agent modules"). */
export interface ToolDefinition {
  description: string;
  /** A JSON Schema of the arguments. */
  parameters: Record<string, unknown>;
  /** Safe to run again with the same idempotency key after a failover. */
  idempotent: boolean;
  /** A string or a JSON value; a throw is an `is_error` result. */
  run(args: Record<string, unknown>, context: ToolRunContext): unknown;
}
