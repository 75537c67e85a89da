/**
 * A `ModelClient` for any OpenAI-compatible Chat Completions server (OpenAI,
 * vLLM, Ollama, llama.cpp, LiteLLM) on the official `openai` SDK: its HTTP
 * and SSE reading, none of its retries (the agent retries, announcing each).
 * Tool calls are assembled by their `index` from however the stream split
 * their arguments; the usage chunk is asked for (`include_usage`).
 */
import type OpenAI from 'openai';
import type {
  ChatCompletionChunk,
  ChatCompletionCreateParamsBase,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from 'openai/resources/chat/completions';
import {
  ModelRequestError,
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
} from './model-client.js';

/** The SDK (its error classes) and a client of it. */
interface Connected {
  sdk: typeof OpenAI;
  client: OpenAI;
}

export class OpenAiChatClient implements ModelClient {
  /** Made at the first request: a process that never asks such a server never loads the SDK (150 modules). */
  private connecting: Promise<Connected> | undefined;
  /** OpenAI's API wants `max_completion_tokens` (its reasoning models refuse `max_tokens`). */
  private readonly openAiItself: boolean;

  constructor(
    private readonly baseUrl: string,
    private readonly apiKey: string | undefined,
    private readonly model: string,
  ) {
    this.openAiItself = new URL(baseUrl).hostname === 'api.openai.com';
  }

  private connected(): Promise<Connected> {
    this.connecting ??= import('openai').then(({ default: sdk }) => ({
      sdk,
      client: new sdk({
        baseURL: this.baseUrl,
        // Local servers (Ollama, vLLM) take no key: then no Authorization header is sent.
        apiKey: this.apiKey || 'none',
        ...(this.apiKey ? {} : { defaultHeaders: { Authorization: null } }),
        // Explicit, so that nothing is read from the environment.
        adminAPIKey: null,
        organization: null,
        project: null,
        maxRetries: 0,
        // Failures reach the agent as errors; the service's logs are its own JSON lines.
        logLevel: 'off',
      }),
    }));
    return this.connecting;
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelPart> {
    const { sdk, client } = await this.connected();
    const stream = await requestModel(
      () =>
        client.chat.completions.create(
          {
            ...this.params(request),
            stream: true,
            stream_options: { include_usage: true },
          },
          { signal },
        ),
      sdk,
    );
    const calls = new Map<number, StreamedToolCall>();
    let reason: FinishReason | undefined;
    let usage;
    let refused = false;
    try {
      for await (const chunk of stream) {
        if (chunk.usage) {
          const { prompt_tokens, completion_tokens } = chunk.usage;
          usage = usageFrom(
            prompt_tokens,
            completion_tokens,
            (chunk.usage as { cost?: unknown }).cost,
          );
        }
        const choice = chunk.choices[0];
        if (!choice) continue;
        const { delta } = choice;
        if (delta.content) yield { type: 'text', text: delta.content };
        if (delta.refusal) refused = true;
        for (const piece of delta.tool_calls ?? []) addToolCallPiece(calls, piece);
        if (choice.finish_reason) reason = finishReason(choice.finish_reason);
      }
    } catch (error) {
      throw modelErrorOf(error, 'cut', sdk);
    }
    // Without the provider's finish reason the stream was cut short.
    yield* endOfStream(signal, reason !== undefined, calls.values(), {
      reason: refused ? 'content-filter' : (reason ?? 'other'),
      usage,
    });
  }

  async complete(request: ModelRequest, signal: AbortSignal): Promise<ModelAnswer> {
    const { sdk, client } = await this.connected();
    const answer = await requestModel(
      () => client.chat.completions.create({ ...this.params(request), stream: false }, { signal }),
      sdk,
    );
    const choice = answer.choices[0];
    if (!choice) throw new ModelRequestError('unreadable', 'the answer has no choice');
    return {
      text: choice.message.content ?? '',
      reason: finishReason(choice.finish_reason),
      usage: usageFrom(answer.usage?.prompt_tokens, answer.usage?.completion_tokens),
    };
  }

  private params(request: ModelRequest): ChatCompletionCreateParamsBase {
    const tools: ChatCompletionTool[] = request.tools.map((tool) => ({
      type: 'function',
      function: {
        name: tool.name,
        description: tool.description,
        parameters: tool.parameters,
      },
    }));
    return {
      model: this.model,
      messages: chatMessages(request),
      ...(tools.length > 0 ? { tools } : {}),
      ...(request.temperature === undefined ? {} : { temperature: request.temperature }),
      ...(request.outputCap === undefined
        ? {}
        : this.openAiItself
          ? { max_completion_tokens: request.outputCap }
          : { max_tokens: request.outputCap }),
    };
  }
}

function chatMessages(request: ModelRequest): ChatCompletionMessageParam[] {
  const messages: ChatCompletionMessageParam[] = [];
  if (request.system !== undefined) messages.push({ role: 'system', content: request.system });
  for (const message of request.messages) {
    if (message.role !== 'tool_calls') {
      messages.push({ role: message.role, content: message.content });
      continue;
    }
    messages.push({
      role: 'assistant',
      content: message.text ?? null,
      tool_calls: message.calls.map((c) => ({
        id: c.id,
        type: 'function',
        function: { name: c.tool, arguments: JSON.stringify(c.input) },
      })),
    });
    for (const c of message.calls) {
      messages.push({ role: 'tool', tool_call_id: c.id, content: c.result });
    }
  }
  return messages;
}

type ToolCallPiece = NonNullable<ChatCompletionChunk.Choice.Delta['tool_calls']>[number];

/**
 * The first piece of a call names it; the others add to its arguments.
 * Pieces belong to calls by `index`; some servers leave it out, and then a
 * piece with a new id starts a call and one without continues the last.
 */
function addToolCallPiece(calls: Map<number, StreamedToolCall>, piece: ToolCallPiece): void {
  let index = piece.index as number | undefined;
  if (index === undefined) {
    const last = [...calls.keys()].at(-1);
    const continues = last !== undefined && (!piece.id || calls.get(last)!.id === piece.id);
    index = continues ? last : calls.size;
  }
  const known = calls.get(index);
  if (!known) {
    calls.set(index, {
      id: piece.id ?? '',
      name: piece.function?.name ?? '',
      args: piece.function?.arguments ?? '',
    });
    return;
  }
  if (piece.id && !known.id) known.id = piece.id;
  if (piece.function?.name && !known.name) known.name = piece.function.name;
  known.args += piece.function?.arguments ?? '';
}

function finishReason(reason: string | null): FinishReason {
  switch (reason) {
    case 'stop':
      return 'stop';
    case 'length':
      return 'length';
    case 'tool_calls':
    case 'function_call':
      return 'tool-calls';
    case 'content_filter':
      return 'content-filter';
    default:
      return 'other';
  }
}
