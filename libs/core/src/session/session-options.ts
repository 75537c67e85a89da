/** How a session is made: what it runs on, and the deployment's options for it. */
import type { MultitaskStrategy } from '@cs/protocol';
import type { Agent } from '../agent.js';
import type { ConversationRef } from '../conversation.js';
import type { ConversationBroadcaster } from '../ports/broadcaster.port.js';
import type { Clock } from '../ports/clock.port.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import type { RuntimeMetrics } from '../ports/runtime-metrics.port.js';
import type { Tracing } from '../ports/tracing.port.js';
import type { ScopedStateChange } from '../state.js';
import type { ToolRegistry } from '../tools/tool-registry.js';
import type { SessionEndReason } from './session-lifecycle.js';
import type { StepUsage } from './step-runner.js';

export interface AgentSessionOptions {
  /** Steps one turn may take (`MAX_ITERATIONS`); a conversation's own limit may only lower it. */
  maxIterations: number;
  /** The most one turn may cost (`MAX_BUDGET_PER_TASK_USD`; 0: none). */
  maxBudgetUsd?: number;
  /** The deployment's `MULTITASK_STRATEGY` (a conversation's own wins). */
  multitaskStrategy?: MultitaskStrategy;
  /** The tools agents may call (default: the built-ins). */
  tools?: ToolRegistry;
  metrics?: RuntimeMetrics;
  /** Turns, steps and tool calls as spans of their message's trace. */
  tracing?: Tracing;
  /** Prices a usage by `LLM_PRICES` (the conversation's model, if it names one). */
  price?: (model: string | undefined, usage: StepUsage) => number;
  /** `LLM_MODEL`: the model usage is recorded under when a conversation names none. */
  defaultModel?: string;
  /**
   * How often the session looks for new user events without a wake-up
   * (default 1000 ms); 0: never, its holder looks for them (see `lastEventId`).
   */
  catchUpIntervalMs?: number;
  clock?: Clock;
  /** Events read per page when restoring and catching up (default 500). */
  readPageSize?: number;
  /**
   * Where what went wrong is told in full (logs): clients see only a safe
   * message (an agent's exception text may hold a backend's host names).
   */
  reportError?: (message: string, error: unknown) => void;
  /**
   * Called once the session has ended, however it ended (what the process
   * keeps for the conversation, such as its MCP sessions, may go).
   */
  onEnd?: (ref: ConversationRef, reason: SessionEndReason) => void;
  /**
   * Called after each write that stored `app:` or `user:` keys: the other
   * running conversations that share them are to hear of it
   * (`AgentSession.scopedStateChanged`), wherever they run.
   */
  onScopedStateChange?: (change: ScopedStateChange) => void;
}

/** What every session of a process shares: tools, metrics, the deployment's limits and prices. */
export type SessionRuntime = Pick<
  AgentSessionOptions,
  | 'tools'
  | 'metrics'
  | 'tracing'
  | 'maxBudgetUsd'
  | 'multitaskStrategy'
  | 'price'
  | 'defaultModel'
  | 'onEnd'
  | 'onScopedStateChange'
>;

export interface AgentSessionInit {
  store: ConversationStore;
  broadcaster: ConversationBroadcaster;
  ref: ConversationRef;
  /** The epoch from `store.acquireLease`, acquired by the caller before `start()`. */
  leaseEpoch: number;
  agent: Agent;
  options: AgentSessionOptions;
}
