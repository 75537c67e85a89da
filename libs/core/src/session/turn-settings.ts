/**
 * The limits of one turn: the deployment's, lowered (never raised) by the
 * conversation's own; the tools its `agent_config.tools` allows; prices by
 * the model its `agent_config.model` names.
 */
import type { ConversationRecord } from '../conversation.js';
import type { StepUsage } from './step-runner.js';
import type { TurnSettings } from './turn-deps.js';

export interface DeploymentLimits {
  /** `MAX_ITERATIONS`. */
  maxIterations: number;
  /** `MAX_BUDGET_PER_TASK_USD` (0 or absent: none). */
  maxBudgetUsd?: number;
  /** `LLM_PRICES` of a model. */
  price?: (model: string | undefined, usage: StepUsage) => number;
  /** `LLM_MODEL`. */
  defaultModel?: string;
}

export function turnSettings(
  limits: DeploymentLimits,
  record: ConversationRecord | null,
): TurnSettings {
  const settings = record?.settings;
  const config = record?.agent.config ?? {};
  const tools = Array.isArray(config['tools'])
    ? (config['tools'] as unknown[]).filter((t): t is string => typeof t === 'string')
    : undefined;
  const model = typeof config['model'] === 'string' ? config['model'] : undefined;
  const budget = limits.maxBudgetUsd ?? 0;
  return {
    maxIterations: Math.min(limits.maxIterations, settings?.maxIterations ?? Infinity),
    maxBudgetUsd:
      budget > 0
        ? Math.min(budget, settings?.maxBudgetUsd ?? Infinity)
        : (settings?.maxBudgetUsd ?? 0),
    allowedTools: tools,
    price: (usage) => limits.price?.(model, usage) ?? 0,
    // As `price` reads it; an agent that is no model's (a remote agent
    // without `agent_config.model` where no LLM_MODEL is set) by its name.
    usageModel: model ?? limits.defaultModel ?? record?.agent.name ?? '',
  };
}
