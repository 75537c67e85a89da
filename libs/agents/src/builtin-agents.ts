/**
 * The built-in agents that need configuration: `llm` (when `LLM_MODEL` is
 * set) and `http` (when `AGENT_HTTP_URL` is set), as factories from a
 * conversation's `agent_config`, and the check of that `agent_config` at
 * creation (docs/protocol.md "Agents": `model` in `LLM_MODELS`, `tools` names,
 * `temperature`).
 */
import { z } from 'zod';
import { BadRequestError, type Agent, type ModelBudget } from '@cs/core';
import type { AppConfig } from '@cs/config';
import { ToolNameSchema } from '@cs/protocol';
import { HTTP_AGENT, HttpAgent } from './http/http.agent.js';
import { LLM_AGENT, LlmAgent, type LlmAgentSettings } from './llm/llm.agent.js';

export type AgentMaker = (agentConfig: Record<string, unknown>) => Agent;

const LlmAgentConfigSchema = z.object({
  model: z.string().optional(),
  tools: z.array(ToolNameSchema).max(1000).optional(),
  temperature: z.number().min(0).max(2).optional(),
});

export interface BuiltinAgentsOptions {
  /** Told the duration of each model request of the `llm` agent (`cs_llm_request_seconds`). */
  onModelRequest?: (seconds: number) => void;
  /** The budgets every model request of the `llm` agent is held against (default: none). */
  budget?: ModelBudget;
}

/** The agents of this deployment's configuration, by name. */
export function builtinAgents(
  config: AppConfig,
  options: BuiltinAgentsOptions = {},
): Record<string, AgentMaker> {
  const agents: Record<string, AgentMaker> = {};
  if (config.llm.model) {
    const llmOptions = {
      ...(options.onModelRequest ? { onRequestEnded: options.onModelRequest } : {}),
      ...(options.budget ? { budget: options.budget } : {}),
    };
    agents[LLM_AGENT] = (agentConfig) => new LlmAgent(llmSettings(agentConfig, config), llmOptions);
  }
  const { url, secret, timeoutMs } = config.agentHttp;
  if (url && secret) {
    agents[HTTP_AGENT] = (agentConfig) => new HttpAgent({ url, secret, timeoutMs, agentConfig });
  }
  return agents;
}

/**
 * Checks a conversation's `agent_config` for agent `name` (at creation):
 * throws `BadRequestError` naming the field. Agents other than `llm` take any
 * JSON object.
 */
export function validateAgentConfig(
  name: string,
  agentConfig: Record<string, unknown>,
  config: AppConfig,
): void {
  if (name === LLM_AGENT) llmSettings(agentConfig, config);
}

function llmSettings(agentConfig: Record<string, unknown>, config: AppConfig): LlmAgentSettings {
  const { llm } = config;
  if (!llm.model) throw new BadRequestError('the llm agent is not configured (LLM_MODEL)', 'agent');
  const parsed = LlmAgentConfigSchema.safeParse(agentConfig);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = `agent_config.${String(issue.path[0] ?? '')}`.replace(/\.$/, '');
    throw new BadRequestError(`${field}: ${issue.message}`, field);
  }
  const { model = llm.model, tools, temperature } = parsed.data;
  if (llm.provider === 'anthropic' && temperature !== undefined && temperature > 1) {
    // Anthropic's range is 0–1: every request of the conversation would be refused.
    throw new BadRequestError(
      'agent_config.temperature: must be at most 1 for Anthropic models',
      'agent_config.temperature',
    );
  }
  if (!llm.models.includes(model)) {
    throw new BadRequestError(
      `agent_config.model: must be one of ${llm.models.join(', ')}`,
      'agent_config.model',
    );
  }
  return { llm, model, temperature, toolNames: tools };
}
