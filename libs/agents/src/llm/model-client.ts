/**
 * What the `llm` agent asks of a model provider, in the provider's absence:
 * one streamed request (text deltas, tool calls with whole arguments, the
 * finish reason and usage) and one short answer without streaming (titles).
 * `openai-chat.client.ts` and `anthropic-messages.client.ts` implement it on
 * the providers' official SDKs; they turn every failure into a
 * `ModelRequestError`, so that what to retry and what to tell users is
 * decided in one place (`llm-failure.ts`).
 */
import type { ToolDescription } from '@cs/protocol';

/**
 * The tool names model providers accept (OpenAI's function names, Anthropic's
 * tool names): a tool named otherwise is never offered to a model, or every
 * request that lists it would be refused.
 */
export const MODEL_TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** One tool call of an earlier step, with its result. */
export interface PromptToolCall {
  id: string;
  tool: string;
  input: unknown;
  result: string;
  isError: boolean;
}

/** A message of the prompt: a turn's text, or one step's tool calls with their results. */
export type PromptMessage =
  | { role: 'user' | 'assistant'; content: string }
  /** `text`: what the model wrote in the step before its calls. */
  | { role: 'tool_calls'; text?: string; calls: PromptToolCall[] };

export interface ModelRequest {
  system: string | undefined;
  messages: readonly PromptMessage[];
  tools: readonly ToolDescription[];
  temperature: number | undefined;
  /**
   * A cap on the answer, for a provider that requires one (Anthropic's
   * `max_tokens`; its default is the model family's most). OpenAI-compatible
   * servers are not sent it: OpenAI's reasoning models refuse `max_tokens`, and
   * spend a small `max_completion_tokens` on reasoning, leaving no answer.
   */
  maxOutputTokens?: number;
  /**
   * `LLM_MAX_OUTPUT_TOKENS`: the cap every provider is sent with a step's
   * request (budgets reserve against it): OpenAI's own API as
   * `max_completion_tokens`, other OpenAI-compatible servers as `max_tokens`,
   * Anthropic as `max_tokens`.
   */
  outputCap?: number;
}

/** `other`: a reason the provider gave that is none of the others. */
export type FinishReason = 'stop' | 'length' | 'tool-calls' | 'content-filter' | 'other';

export interface ModelUsage {
  prompt_tokens: number;
  completion_tokens: number;
  /** USD, when the provider reports it (OpenRouter, LiteLLM). */
  reported_cost: number | undefined;
}

export type ModelPart =
  | { type: 'text'; text: string }
  /** Whole: its arguments assembled from however the stream split them. */
  | { type: 'tool-call'; id: string; name: string; input: unknown }
  /** The last part of a stream that ended well. */
  | { type: 'finish'; reason: FinishReason; usage: ModelUsage | undefined };

export interface ModelAnswer {
  text: string;
  reason: FinishReason;
  usage: ModelUsage | undefined;
}

export interface ModelClient {
  /**
   * The parts of one streamed answer, as they arrive. It ends with a `finish`
   * part, or throws a `ModelRequestError`; leaving the iteration early, or
   * aborting `signal`, closes the connection.
   */
  stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelPart>;
  /** One answer without streaming. */
  complete(request: ModelRequest, signal: AbortSignal): Promise<ModelAnswer>;
}

/**
 * Why a model request failed: `status`, the server answered with an HTTP
 * error (its headers kept for `retry-after`); `connection`, it could not be
 * reached or the connection broke; `cut`, the answer stopped before its end;
 * `stream-error`, the server reported an error inside the stream;
 * `unreadable`, an answer that is not what the API says.
 */
export type ModelFailureKind = 'status' | 'connection' | 'cut' | 'stream-error' | 'unreadable';

export class ModelRequestError extends Error {
  readonly kind: ModelFailureKind;
  readonly status: number | undefined;
  readonly headers: Record<string, string> | undefined;

  constructor(
    kind: ModelFailureKind,
    message: string,
    options: { status?: number; headers?: Record<string, string>; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'ModelRequestError';
    this.kind = kind;
    this.status = options.status;
    this.headers = options.headers;
  }
}

/** The error classes of a provider's SDK (the `openai` and `@anthropic-ai/sdk` ones share a shape). */
export interface SdkErrors {
  APIError: abstract new (...args: never[]) => Error & {
    status: number | undefined;
    headers: Headers | undefined;
  };
  APIConnectionError: abstract new (...args: never[]) => Error;
}

/**
 * A failure of an SDK call as a `ModelRequestError`. `broken` is what a
 * failure with no HTTP status is at that point: `connection` before the
 * answer began, `cut` while it streamed.
 */
export function modelErrorOf(
  error: unknown,
  broken: 'connection' | 'cut',
  sdk: SdkErrors,
): ModelRequestError {
  if (error instanceof ModelRequestError) return error;
  if (error instanceof sdk.APIError && error.status !== undefined) {
    return new ModelRequestError('status', error.message, {
      status: error.status,
      headers: error.headers ? Object.fromEntries(error.headers.entries()) : undefined,
      cause: error,
    });
  }
  if (error instanceof sdk.APIConnectionError) {
    return new ModelRequestError('connection', error.message, { cause: error });
  }
  // An error the server sent inside the stream (an `error` chunk or event).
  if (error instanceof sdk.APIError) {
    return new ModelRequestError('stream-error', error.message, { cause: error });
  }
  if (error instanceof SyntaxError) {
    return new ModelRequestError('unreadable', 'a part of the stream is not JSON', {
      cause: error,
    });
  }
  const message = error instanceof Error ? error.message : String(error);
  return new ModelRequestError(broken, message, { cause: error });
}

/** Makes the SDK's request; its failures are `ModelRequestError`s. */
export async function requestModel<T>(request: () => PromiseLike<T>, sdk: SdkErrors): Promise<T> {
  try {
    return await request();
  } catch (error) {
    throw modelErrorOf(error, 'connection', sdk);
  }
}

/** Usage as providers report it; undefined when they report nothing. */
export function usageFrom(
  promptTokens: number | null | undefined,
  completionTokens: number | null | undefined,
  cost?: unknown,
): ModelUsage | undefined {
  if (promptTokens == null && completionTokens == null) return undefined;
  return {
    prompt_tokens: promptTokens ?? 0,
    completion_tokens: completionTokens ?? 0,
    reported_cost:
      typeof cost === 'number' && Number.isFinite(cost) && cost >= 0 ? cost : undefined,
  };
}

/** A tool call as the pieces of a stream add up: its arguments are JSON text so far. */
export interface StreamedToolCall {
  id: string;
  name: string;
  args: string;
}

/**
 * The parts that end a stream: its tool calls, whole, then `finish`. The
 * SDKs end a stream quietly when its request is aborted, and a stream that
 * stopped before the provider's end (`ended` false) was cut short: both are
 * `cut` errors, never a finished answer.
 */
export function* endOfStream(
  signal: AbortSignal,
  ended: boolean,
  calls: Iterable<StreamedToolCall>,
  finish: Omit<Extract<ModelPart, { type: 'finish' }>, 'type'>,
): Iterable<ModelPart> {
  if (signal.aborted) throw new ModelRequestError('cut', 'the request was aborted');
  if (!ended) throw new ModelRequestError('cut', 'the stream ended before its end');
  for (const call of calls) {
    yield { type: 'tool-call', id: call.id, name: call.name, input: parseToolInput(call.args) };
  }
  yield { type: 'finish', ...finish };
}

/** A tool call's arguments as sent: a JSON object, else `{}` (the runtime then answers bad arguments). */
function parseToolInput(json: string): unknown {
  if (json.trim() === '') return {};
  try {
    return JSON.parse(json) as unknown;
  } catch {
    return {};
  }
}
