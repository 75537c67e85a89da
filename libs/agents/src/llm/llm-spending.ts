/**
 * What one conversation's model requests cost: each request's worst case is
 * held in the budgets before it is sent, and its usage priced by
 * `LLM_PRICES` unless the provider reported a cost.
 */
import {
  AgentTurnError,
  BudgetExhaustedError,
  type AgentContext,
  type BudgetHold,
  type ModelBudget,
} from '@cs/core';
import type { AgentOutput } from '@cs/protocol';
import { costOf, type LlmAgentSettings } from './llm-model.js';
import type { ModelUsage } from './model-client.js';

/** A usage as agents report it (`usage` outputs, a title's usage). */
export interface UsageFields {
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd?: number;
}

export class LlmSpending {
  constructor(
    private readonly settings: LlmAgentSettings,
    private readonly budget: ModelBudget,
  ) {}

  /**
   * Holds the worst case of one request in the budgets: the prompt's counted
   * tokens at the input price and `LLM_MAX_OUTPUT_TOKENS` at the output
   * price (`LLM_PRICES` of this model; a model without a price costs 0).
   */
  async hold(
    context: AgentContext,
    promptTokens: number,
  ): Promise<BudgetHold & { worstCaseUsd: number }> {
    const worstCaseUsd =
      costOf(
        this.settings.llm.prices,
        this.settings.model,
        promptTokens,
        this.settings.llm.maxOutputTokens,
      ) ?? 0;
    try {
      const hold = await this.budget.reserve({
        tenantId: context.tenant_id,
        userId: context.user_id,
        worstCaseUsd,
      });
      return { settle: (cost) => hold.settle(cost), release: () => hold.release(), worstCaseUsd };
    } catch (error) {
      if (error instanceof BudgetExhaustedError) {
        throw new AgentTurnError('budget_exhausted', error.message, { cause: error });
      }
      throw error;
    }
  }

  costOf(usage: ModelUsage): number | undefined {
    return this.usageFields(usage).cost_usd;
  }

  usageOutput(usage: ModelUsage): AgentOutput {
    return { type: 'usage', ...this.usageFields(usage) };
  }

  usageFields(usage: ModelUsage): UsageFields {
    const cost =
      usage.reported_cost ??
      costOf(
        this.settings.llm.prices,
        this.settings.model,
        usage.prompt_tokens,
        usage.completion_tokens,
      );
    return {
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
      ...(cost === undefined ? {} : { cost_usd: cost }),
    };
  }
}
