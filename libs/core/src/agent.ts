import type { EventBody, StoredEvent } from '@cs/protocol';
import type { AgentSpec, MetricsDelta, StateDelta } from './conversation.js';

/** What an agent is given for one turn. */
export interface AgentTurn {
  conversationId: string;
  /** The whole stored history up to and including `trigger`. */
  history: readonly StoredEvent[];
  /** The merged session state (`app:`, `user:`, plain and this run's `temp:` keys). */
  state: Readonly<Record<string, unknown>>;
  /** The conversation's instructions (system prompt), if any. */
  instructions: string | null;
  /** The user message this turn answers. */
  trigger: StoredEvent;
  /** Aborted when the turn must end: stop, pause, lease lost, shutdown. */
  signal: AbortSignal;
}

/** What an agent yields: stored events, or ephemeral token deltas. */
export type AgentOutput =
  | { type: 'event'; body: EventBody; stateDelta?: StateDelta; metricsDelta?: MetricsDelta }
  | { type: 'delta'; delta: string };

/**
 * An agent: given a turn, yields events. It holds no conversation state of its
 * own between turns; everything it needs is in the history and the state.
 */
export interface Agent {
  run(turn: AgentTurn): AsyncIterable<AgentOutput>;
}

/** Makes agents by name (`AGENT`, a conversation's `agent` field). */
export interface AgentFactory {
  has(name: string): boolean;
  create(spec: AgentSpec): Agent;
}
