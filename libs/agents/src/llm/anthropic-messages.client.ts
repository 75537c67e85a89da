/**
 * A `ModelClient` for Anthropic's Messages API on the official
 * `@anthropic-ai/sdk`: its HTTP and SSE reading, none of its retries or
 * spans (the agent retries, announcing each, and makes its own spans).
 * `tool_use` input is assembled from its `input_json_delta` pieces; an
 * answer is complete only once `message_stop` has come.
 */
import type Anthropic from '@anthropic-ai/sdk';
import type {
  ContentBlockParam,
  MessageCreateParamsBase,
  MessageParam,
  RawMessageStreamEvent,
  Tool,
} from '@anthropic-ai/sdk/resources/messages/messages';
import {
  modelErrorOf,
  requestModel,
  endOfStream,
  usageFrom,
  type FinishReason,
  type ModelAnswer,
  type ModelClient,
  type ModelPart,
  type ModelRequest,
  type StreamedToolCall,
  type ModelUsage,
} from './model-client.js';

/** The SDK (its error classes) and a client of it. */
interface Connected {
  sdk: typeof Anthropic;
  client: Anthropic;
}

export class AnthropicMessagesClient implements ModelClient {
  /** Made at the first request: a process that never asks Anthropic never loads its SDK (4 MB). */
  private connecting: Promise<Connected> | undefined;

  constructor(
    private readonly baseUrl: string,
    private readonly apiKey: string | undefined,
    private readonly model: string,
  ) {}

  private connected(): Promise<Connected> {
    this.connecting ??= import('@anthropic-ai/sdk').then(({ default: sdk }) => ({
      sdk,
      client: new sdk({
        baseURL: this.baseUrl,
        // Explicit, so that no credential is looked for in the environment; with
        // no key (a local proxy that takes none), no key header is sent.
        apiKey: this.apiKey || null,
        authToken: null,
        ...(this.apiKey ? {} : { defaultHeaders: { 'X-Api-Key': null } }),
        maxRetries: 0,
        logLevel: 'off',
        openTelemetry: false,
      }),
    }));
    return this.connecting;
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelPart> {
    const { sdk, client } = await this.connected();
    const stream = await requestModel(
      () => client.messages.create({ ...this.params(request), stream: true }, { signal }),
      sdk,
    );
    const calls = new Map<number, StreamedToolCall>();
    let input: Usage = {};
    let output: number | undefined;
    let reason: FinishReason | undefined;
    let stopped = false;
    try {
      for await (const event of stream as AsyncIterable<RawMessageStreamEvent>) {
        switch (event.type) {
          case 'message_start':
            input = event.message.usage;
            output = event.message.usage.output_tokens;
            break;
          case 'content_block_start':
            if (event.content_block.type === 'tool_use') {
              const { id, name } = event.content_block;
              calls.set(event.index, { id, name, args: '' });
            } else if (event.content_block.type === 'text' && event.content_block.text) {
              yield { type: 'text', text: event.content_block.text };
            }
            break;
          case 'content_block_delta':
            if (event.delta.type === 'text_delta' && event.delta.text) {
              yield { type: 'text', text: event.delta.text };
            } else if (event.delta.type === 'input_json_delta') {
              const call = calls.get(event.index);
              if (call) call.args += event.delta.partial_json;
            }
            break;
          case 'message_delta':
            reason = finishReason(event.delta.stop_reason);
            output = event.usage.output_tokens;
            break;
          case 'message_stop':
            stopped = true;
            break;
          default:
            break;
        }
      }
    } catch (error) {
      throw modelErrorOf(error, 'cut', sdk);
    }
    // An answer is whole only once `message_stop` came.
    yield* endOfStream(signal, stopped, calls.values(), {
      reason: reason ?? 'other',
      usage: usageOf(input, output),
    });
  }

  async complete(request: ModelRequest, signal: AbortSignal): Promise<ModelAnswer> {
    const { sdk, client } = await this.connected();
    const answer = await requestModel(
      () => client.messages.create({ ...this.params(request), stream: false }, { signal }),
      sdk,
    );
    const text = answer.content.map((block) => (block.type === 'text' ? block.text : '')).join('');
    return {
      text,
      reason: finishReason(answer.stop_reason),
      usage: usageOf(answer.usage, answer.usage.output_tokens),
    };
  }

  private params(request: ModelRequest): MessageCreateParamsBase {
    const tools: Tool[] = request.tools.map((tool) => ({
      name: tool.name,
      description: tool.description,
      input_schema: tool.parameters as Tool.InputSchema,
    }));
    return {
      model: this.model,
      max_tokens: request.maxOutputTokens ?? request.outputCap ?? maxOutputTokens(this.model),
      messages: anthropicMessages(request),
      ...(request.system === undefined ? {} : { system: request.system }),
      ...(tools.length > 0 ? { tools } : {}),
      ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
    };
  }
}

/**
 * The Messages API needs `max_tokens`. The most each model family allows:
 * Claude 3 models 4,096, Claude 3.5 models 8,192, later ones at least 32,000.
 */
export function maxOutputTokens(model: string): number {
  if (/^claude-3-(opus|sonnet|haiku)-/.test(model)) return 4096;
  if (/^claude-3-5-/.test(model)) return 8192;
  return 32_000;
}

/** User and assistant turns; a step's tool calls, then their results in the user turn after them. */
function anthropicMessages(request: ModelRequest): MessageParam[] {
  const messages: { role: 'user' | 'assistant'; content: ContentBlockParam[] }[] = [];
  const add = (role: 'user' | 'assistant', blocks: ContentBlockParam[]) => {
    if (blocks.length === 0) return;
    // Consecutive turns of one role are one turn.
    const last = messages.at(-1);
    if (last?.role === role) last.content.push(...blocks);
    else messages.push({ role, content: blocks });
  };
  for (const message of request.messages) {
    if (message.role !== 'tool_calls') {
      // Empty text blocks are refused (the prompt holds no blank text: prompt-messages.ts).
      add(message.role, message.content ? [{ type: 'text', text: message.content }] : []);
      continue;
    }
    add('assistant', [
      ...(message.text ? [{ type: 'text' as const, text: message.text }] : []),
      ...message.calls.map((c) => ({
        type: 'tool_use' as const,
        id: c.id,
        name: c.tool,
        input: isObject(c.input) ? c.input : {},
      })),
    ]);
    add(
      'user',
      message.calls.map((c) => ({
        type: 'tool_result',
        tool_use_id: c.id,
        content: c.result,
        ...(c.isError ? { is_error: true } : {}),
      })),
    );
  }
  return messages;
}

interface Usage {
  input_tokens?: number | null;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
}

/** Prompt tokens include those written to and read from the prompt cache. */
function usageOf(input: Usage, output: number | undefined): ModelUsage | undefined {
  const cached = (input.cache_creation_input_tokens ?? 0) + (input.cache_read_input_tokens ?? 0);
  const prompt = input.input_tokens == null ? undefined : input.input_tokens + cached;
  return usageFrom(prompt, output);
}

function finishReason(reason: string | null): FinishReason {
  switch (reason) {
    case 'end_turn':
    case 'stop_sequence':
      return 'stop';
    case 'max_tokens':
      return 'length';
    case 'tool_use':
      return 'tool-calls';
    case 'refusal':
      return 'content-filter';
    default:
      return 'other';
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
