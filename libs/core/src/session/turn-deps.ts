/**
 * The seams of a turn: what it needs of its session (`TurnDeps`, its limits
 * `TurnSettings`), and its way out while it runs (`TurnWrites`, an `ActiveTurn`).
 */
import type { StoredEvent } from '@cs/protocol';
import type { Agent } from '../agent.js';
import type { ConversationRef, EventDraft } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import type { RuntimeMetrics } from '../ports/runtime-metrics.port.js';
import type { Tracing } from '../ports/tracing.port.js';
import type { ToolRegistry } from '../tools/tool-registry.js';
import type { SessionConversation } from './session-conversation.js';
import type { SessionOutlet } from './session-outlet.js';
import type { StepUsage } from './step-runner.js';
import type { RecentEvents } from './turn-history.js';
import type { UserEventQueue } from './user-event-queue.js';

export interface TurnSettings {
  maxIterations: number;
  /** 0: none. */
  maxBudgetUsd: number;
  /** Tools the agent may call (`agent_config.tools`), or all. */
  allowedTools: readonly string[] | undefined;
  /** Prices a usage the agent did not price (`LLM_PRICES` of its model). */
  price: (usage: StepUsage) => number;
  /** The model its usage is recorded under (`model_usage`). */
  usageModel: string;
}

/** What a turn needs of its session. */
export interface TurnDeps {
  ref: ConversationRef;
  store: ConversationStore;
  agent: Agent;
  tools: ToolRegistry;
  metrics: RuntimeMetrics;
  tracing: Tracing;
  settings: TurnSettings;
  /**
   * Its confirmation mode, state and instructions as they are now, read
   * again before each step (`refreshSharedState`: a PATCH, or `app:` and
   * `user:` keys another conversation changed, apply from the next step on).
   */
  conversation: SessionConversation;
  cache: RecentEvents;
  /** The id of the last stored event the session knows (`lastEventId`). */
  queue: Pick<UserEventQueue, 'lastEventId'>;
  /** Its live traffic, and the writes of `end` (a running turn writes through `TurnWrites`). */
  outlet: SessionOutlet;
  reportError: (message: string, error: unknown) => void;
}

/** A running turn's way out: the signal that cuts it, and its appends in order ('running' first). */
export interface TurnWrites {
  readonly signal: AbortSignal;
  append(drafts: EventDraft[]): Promise<StoredEvent[]>;
}
