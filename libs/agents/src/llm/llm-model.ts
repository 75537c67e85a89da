/**
 * The model behind the `llm` agent, through the AI SDK's providers:
 * `openai` is any OpenAI-compatible Chat Completions server (OpenAI, vLLM,
 * Ollama, llama.cpp, LiteLLM), `anthropic` the Messages API. The key is
 * passed explicitly, so the providers never read the environment.
 */
import { createAnthropic } from '@ai-sdk/anthropic';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import type { LanguageModel } from 'ai';
import type { AppConfig } from '@cs/config';

export const OPENAI_BASE_URL = 'https://api.openai.com/v1';
export const ANTHROPIC_BASE_URL = 'https://api.anthropic.com';

// The SDK prints its warnings (unknown model, unsupported setting) with
// console.warn; the service's logs are JSON lines, so they are turned off.
(globalThis as { AI_SDK_LOG_WARNINGS?: boolean }).AI_SDK_LOG_WARNINGS = false;

export function languageModel(
  llm: Pick<AppConfig['llm'], 'provider' | 'baseUrl' | 'apiKey'>,
  model: string,
): LanguageModel {
  const base = (llm.baseUrl ?? '').replace(/\/+$/, '');
  if (llm.provider === 'anthropic') {
    return createAnthropic({
      baseURL: `${base || ANTHROPIC_BASE_URL}/v1`,
      apiKey: llm.apiKey ?? '',
    })(model);
  }
  return createOpenAICompatible({
    name: 'llm',
    baseURL: base || OPENAI_BASE_URL,
    // Local servers (Ollama, vLLM) take none: then no Authorization header is sent.
    ...(llm.apiKey ? { apiKey: llm.apiKey } : {}),
    // `stream_options.include_usage`: the usage chunk at the end of the stream.
    includeUsage: true,
  }).chatModel(model);
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
