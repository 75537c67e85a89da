/** The limits a create may set for its conversation: they may only lower the deployment's. */
import type { AppConfig } from '@cs/config';
import { BadRequestError, type ConversationSettings } from '@cs/core';
import type { CreateConversationBody } from '@cs/protocol';

export function settingsOf(
  body: CreateConversationBody,
  limits: AppConfig['limits'],
): ConversationSettings {
  const { maxIterations, maxBudgetUsd } = limits;
  if (body.max_iterations !== undefined && body.max_iterations > maxIterations) {
    throw new BadRequestError(`max_iterations may be at most ${maxIterations}`, 'max_iterations');
  }
  if (body.max_budget_usd !== undefined && maxBudgetUsd > 0 && body.max_budget_usd > maxBudgetUsd) {
    throw new BadRequestError(`max_budget_usd may be at most ${maxBudgetUsd}`, 'max_budget_usd');
  }
  return {
    confirmationMode: body.confirmation_mode ?? false,
    multitaskStrategy: body.multitask_strategy ?? null,
    maxIterations: body.max_iterations ?? null,
    maxBudgetUsd: body.max_budget_usd ?? null,
  };
}
