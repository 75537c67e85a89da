/**
 * The model behind the `llm` agent: `openai` is any OpenAI-compatible Chat
 * Completions server (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM) on the
 * official `openai` SDK, `anthropic` the Messages API on `@anthropic-ai/sdk`.
 * The key and base URL are passed explicitly, so the SDKs never read them
 * from the environment.
 */
import type { AppConfig } from '@cs/config';
import { AnthropicMessagesClient } from './anthropic-messages.client.js';
import type { ModelClient } from './model-client.js';
import { OpenAiChatClient } from './openai-chat.client.js';

/** What one conversation's `llm` agent runs with. */
export interface LlmAgentSettings {
  llm: AppConfig['llm'];
  /** The model of this conversation (`agent_config.model`, else `LLM_MODEL`). */
  model: string;
  temperature: number | undefined;
  /** The tools it may call (`agent_config.tools`); undefined: all of `context.tools`. */
  toolNames: readonly string[] | undefined;
}

const OPENAI_BASE_URL = 'https://api.openai.com/v1';
const ANTHROPIC_BASE_URL = 'https://api.anthropic.com';

export function modelClient(
  llm: Pick<AppConfig['llm'], 'provider' | 'baseUrl' | 'apiKey'>,
  model: string,
): ModelClient {
  const base = (llm.baseUrl ?? '').replace(/\/+$/, '');
  if (llm.provider === 'anthropic') {
    return new AnthropicMessagesClient(base || ANTHROPIC_BASE_URL, llm.apiKey, model);
  }
  return new OpenAiChatClient(base || OPENAI_BASE_URL, llm.apiKey, model);
}

/** USD for a request's tokens at `LLM_PRICES` (per million), when the model has a price. */
export function costOf(
  prices: AppConfig['llm']['prices'],
  model: string,
  promptTokens: number,
  completionTokens: number,
): number | undefined {
  const price = prices[model];
  if (!price) return undefined;
  return (promptTokens * price.input + completionTokens * price.output) / 1_000_000;
}
