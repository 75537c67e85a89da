/**
 * The limits of one turn: the deployment's, lowered (never raised) by the
 * conversation's own; the tools its `agent_config.tools` allows; prices by
 * the model its `agent_config.model` names.
 */
import type { ConversationRecord } from '../conversation.js';
import type { StepUsage } from './step-runner.js';
import type { TurnSettings } from './turn-runner.js';

export interface DeploymentLimits {
  /** `MAX_ITERATIONS`. */
  maxIterations: number;
  /** `MAX_BUDGET_PER_TASK_USD` (0 or absent: none). */
  maxBudgetUsd?: number;
  /** `LLM_PRICES` of a model. */
  price?: (model: string | undefined, usage: StepUsage) => number;
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
  };
}
