/**
 * The `llm` agent: each step is one streamed model request through the
 * provider's `ModelClient` (its SDK's own retries off). Text deltas are
 * yielded as they arrive; the step ends with the final message, or with one
 * `tool_call` per tool call of the model (arguments assembled however the
 * stream split them), and a `usage` output (cost from `LLM_PRICES` unless
 * the provider reported one).
 *
 * Retries (`LLM_MAX_RETRIES`): on 429, 5xx, connection errors, timeouts and
 * streams cut short, with exponential backoff or the server's `retry-after`,
 * each announced with `STATUS$LLM_RETRY`, also after part of the answer was
 * streamed: the runtime then starts the step's text afresh (its next delta
 * has `offset` 0), so a retry's answer is never glued to the cut one. Tool
 * calls are held until the stream ends well. When the retries are spent, the
 * turn ends in `llm_error` (the runtime stores the partial text as
 * interrupted).
 *
 * Its parts: what requests cost (`llm-spending`), their spans
 * (`llm-request-span`), titles (`llm-title`), the prompt (`llm-prompt`).
 */
import {
  AgentTurnError,
  UNLIMITED_BUDGET,
  type Agent,
  type AgentContext,
  type ModelBudget,
} from '@cs/core';
import { ToolNameSchema, backoffDelay, type AgentOutput, type ToolDescription } from '@cs/protocol';
import { classifyLlmFailure } from './llm-failure.js';
import { modelClient, type LlmAgentSettings } from './llm-model.js';
import {
  RequestSpans,
  endRequestSpan,
  responseAttributes,
  type RequestOutcome,
} from './llm-request-span.js';
import { LlmSpending } from './llm-spending.js';
import { LlmTitles } from './llm-title.js';
import {
  MODEL_TOOL_NAME,
  type FinishReason,
  type ModelClient,
  type ModelUsage,
} from './model-client.js';
import { PromptTooLargeError, buildLlmPrompt, type PromptMemory } from './llm-prompt.js';
import { tokenCounter } from './token-counter.js';

export const LLM_AGENT = 'llm';
export const LLM_RETRY_STATUS = 'STATUS$LLM_RETRY';

export type { LlmAgentSettings } from './llm-model.js';

export interface LlmAgentOptions {
  /** First backoff delay; doubled per retry, with jitter, up to `maxBackoffMs`. */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** Told the duration of each model request (each attempt, and the title request), in seconds. */
  onRequestEnded?: (seconds: number) => void;
  /** Each model request's worst case is held here before it is sent (default: no budget). */
  budget?: ModelBudget;
}

export class LlmAgent implements Agent {
  private readonly model: ModelClient;
  /** Kept from step to step of this conversation. */
  private readonly memory: PromptMemory = {};
  private readonly backoffMs: number;
  private readonly maxBackoffMs: number;
  private readonly spending: LlmSpending;
  private readonly spans: RequestSpans;
  private readonly titles: LlmTitles;

  constructor(
    private readonly settings: LlmAgentSettings,
    options: LlmAgentOptions = {},
  ) {
    this.model = modelClient(settings.llm, settings.model);
    // Where agents run, the tokenizer loads while the first request is made ready.
    tokenCounter().catch(() => undefined);
    this.backoffMs = options.backoffMs ?? 500;
    this.maxBackoffMs = options.maxBackoffMs ?? 8000;
    this.spending = new LlmSpending(settings, options.budget ?? UNLIMITED_BUDGET);
    this.spans = new RequestSpans(settings.llm.provider, settings.model, options.onRequestEnded);
    this.titles = new LlmTitles(this.model, settings, this.spending, this.spans);
  }

  async *step(context: AgentContext): AsyncIterable<AgentOutput> {
    const tools = this.toolsFor(context.tools);
    let prompt;
    try {
      prompt = await buildLlmPrompt(context, tools, this.settings.llm.contextTokens, this.memory);
    } catch (error) {
      if (error instanceof PromptTooLargeError) {
        throw new AgentTurnError('llm_error', 'the instructions and tools do not fit the context', {
          cause: error,
        });
      }
      throw error;
    }
    const { maxRetries } = this.settings.llm;

    for (let attempt = 0; ; attempt += 1) {
      // Stops the request when the consumer stops reading (the runtime's return()).
      const own = new AbortController();
      const timeout = AbortSignal.timeout(this.settings.llm.timeoutMs);
      const signal = AbortSignal.any([context.signal, timeout, own.signal]);
      let text = '';
      let finishReason: FinishReason | undefined;
      let usage: ModelUsage | undefined;
      const calls: AgentOutput[] = [];
      // Not sent unless its worst case fits the budgets; settled or released below.
      const hold = await this.spending.hold(context, prompt.tokens);
      const span = this.spans.start('step', attempt);
      // Until the stream has ended well: a consumer that stops reading leaves it so.
      let outcome: RequestOutcome = { abandoned: true };
      try {
        const parts = this.model.stream(
          {
            system: prompt.system,
            messages: prompt.messages,
            tools,
            temperature: this.settings.temperature,
            outputCap: this.settings.llm.maxOutputTokens,
          },
          signal,
        );
        for await (const part of parts) {
          switch (part.type) {
            case 'text':
              text += part.text;
              yield { type: 'delta', delta: part.text };
              break;
            case 'tool-call':
              calls.push(toolCallOutput(part.name, part.input, part.id));
              break;
            case 'finish':
              finishReason = part.reason;
              usage = part.usage;
              break;
          }
        }
        span.setAttributes(responseAttributes(finishReason, usage));
        outcome = {};
        // What it cost; a request whose usage went unreported counts its worst case.
        await hold
          .settle(usage ? (this.spending.costOf(usage) ?? 0) : hold.worstCaseUsd)
          .catch(() => {
            // Redis unreachable: the hold lapses by itself; Postgres has the usage.
          });
      } catch (error) {
        outcome = { error };
        if (context.signal.aborted) throw abortReason(context.signal);
        const failure = classifyLlmFailure(error, {
          timedOut: timeout.aborted,
          secrets: [this.settings.llm.apiKey],
        });
        const spent = attempt >= maxRetries;
        if (!failure.retryable || spent) {
          const why =
            failure.retryable && maxRetries > 0
              ? `${failure.safeMessage} (after ${maxRetries} ${maxRetries === 1 ? 'retry' : 'retries'})`
              : failure.safeMessage;
          throw new AgentTurnError('llm_error', why, { cause: failure.detail });
        }
        outcome.retried = true;
        // The backoff is no part of the request.
        endRequestSpan(span, outcome, false);
        context.notify?.({
          type: 'info',
          id: LLM_RETRY_STATUS,
          message: 'retrying the model request',
        });
        await sleep(failure.retryAfterMs ?? this.backoff(attempt), context.signal);
        continue;
      } finally {
        own.abort();
        endRequestSpan(span, outcome, context.signal.aborted);
        // Failed, retried or left: nothing was spent that a usage reports (a no-op once settled).
        hold.release().catch(() => undefined);
      }

      if (usage) yield this.spending.usageOutput(usage);
      if (finishReason === 'content-filter') {
        throw new AgentTurnError('llm_error', 'the model declined to answer');
      }
      if (calls.length > 0) {
        if (finishReason === 'length') {
          throw new AgentTurnError(
            'llm_error',
            "the model's tool call was cut at its length limit",
          );
        }
        yield* calls;
        return;
      }
      if (text.length > 0) yield { type: 'message', content: text };
      return;
    }
  }

  title(context: AgentContext): ReturnType<LlmTitles['title']> {
    return this.titles.title(context);
  }

  private toolsFor(tools: readonly ToolDescription[]): ToolDescription[] {
    const allowed = this.settings.toolNames;
    return tools.filter(
      (t) => MODEL_TOOL_NAME.test(t.name) && (allowed === undefined || allowed.includes(t.name)),
    );
  }

  private backoff(attempt: number): number {
    return backoffDelay(attempt, {
      baseMs: this.backoffMs,
      maxMs: this.maxBackoffMs,
      jitter: [0.8, 1.2],
    });
  }
}

/**
 * A model's tool call as an output. A name that is not a tool name, or input
 * that is not a JSON object, still becomes a call: the runtime answers it with
 * an `is_error` result the model sees, instead of the turn failing.
 */
function toolCallOutput(name: string, input: unknown, id: string): AgentOutput {
  const tool = ToolNameSchema.safeParse(name).success
    ? name
    : name.replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 128) || 'unknown_tool';
  const args =
    typeof input === 'object' && input !== null && !Array.isArray(input)
      ? (input as Record<string, unknown>)
      : {};
  return {
    type: 'tool_call',
    tool,
    arguments: args,
    ...(id.length > 0 && id.length <= 256 ? { tool_call_id: id } : {}),
  };
}

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error
    ? signal.reason
    : new Error('aborted', { cause: signal.reason });
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(abortReason(signal));
      return;
    }
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortReason(signal));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
