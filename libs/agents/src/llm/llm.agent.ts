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
 * Each model request (each attempt, and the title request) is a
 * `model request` span, a child of the agent step's span in the message's
 * trace: provider, model, attempt, finish reason and token counts only —
 * never the prompt, the answer, the key or the provider's error text.
 */
import {
  AgentTurnError,
  BudgetExhaustedError,
  UNLIMITED_BUDGET,
  type Agent,
  type AgentContext,
  type BudgetHold,
  type ModelBudget,
} from '@cs/core';
import type { AppConfig } from '@cs/config';
import { startSpan, type OpenSpan } from '@cs/observability';
import {
  ToolNameSchema,
  MAX_MODEL_TITLE_CHARS,
  backoffDelay,
  cutText,
  isAction,
  type AgentOutput,
  type StoredEvent,
  type ToolDescription,
} from '@cs/protocol';
import { classifyLlmFailure, scrubbedError } from './llm-failure.js';
import { costOf, modelClient } from './llm-model.js';
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
const TITLE_SYSTEM =
  'You name conversations. Answer with a title of at most six words for the conversation ' +
  'below, in its language, with no quotes and no final period.';

/** What one conversation's `llm` agent runs with. */
export interface LlmAgentSettings {
  llm: AppConfig['llm'];
  /** The model of this conversation (`agent_config.model`, else `LLM_MODEL`). */
  model: string;
  temperature: number | undefined;
  /** The tools it may call (`agent_config.tools`); undefined: all of `context.tools`. */
  toolNames: readonly string[] | undefined;
}

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
  private readonly onRequestEnded: ((seconds: number) => void) | undefined;
  private readonly budget: ModelBudget;

  constructor(
    private readonly settings: LlmAgentSettings,
    options: LlmAgentOptions = {},
  ) {
    this.model = modelClient(settings.llm, settings.model);
    // Where agents run, the tokenizer loads while the first request is made ready.
    tokenCounter().catch(() => undefined);
    this.backoffMs = options.backoffMs ?? 500;
    this.maxBackoffMs = options.maxBackoffMs ?? 8000;
    this.onRequestEnded = options.onRequestEnded;
    this.budget = options.budget ?? UNLIMITED_BUDGET;
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
      const hold = await this.hold(context, prompt.tokens);
      const span = this.requestSpan('step', attempt);
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
        await hold.settle(usage ? (this.costOf(usage) ?? 0) : hold.worstCaseUsd).catch(() => {
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
        endOpenSpan(span, outcome, false);
        context.notify?.({
          type: 'info',
          id: LLM_RETRY_STATUS,
          message: 'retrying the model request',
        });
        await sleep(failure.retryAfterMs ?? this.backoff(attempt), context.signal);
        continue;
      } finally {
        own.abort();
        endOpenSpan(span, outcome, context.signal.aborted);
        // Failed, retried or left: nothing was spent that a usage reports (a no-op once settled).
        hold.release().catch(() => undefined);
      }

      if (usage) yield this.usageOutput(usage);
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

  async title(context: AgentContext): Promise<{
    title: string;
    usage?: { prompt_tokens: number; completion_tokens: number; cost_usd?: number };
  }> {
    const { first, answer } = await openingExchange(context);
    if (!first) throw new Error('no user message to title');
    const signal = AbortSignal.any([
      context.signal,
      AbortSignal.timeout(Math.min(this.settings.llm.timeoutMs, 30_000)),
    ]);
    let result;
    const titleText = `User: ${cutText(first, 2000)}${answer ? `\n\nAssistant: ${cutText(answer, 2000)}` : ''}`;
    const counter = await tokenCounter();
    // A refused title request throws: the runtime's fallback title is used.
    const hold = await this.hold(
      context,
      counter.count(TITLE_SYSTEM) + counter.count(titleText) + 8,
    );
    const span = this.requestSpan('title', 0);
    let failed: RequestOutcome = {};
    try {
      // One request: when it fails, the runtime's fallback title is good enough.
      // Short by its instructions, cut by `cleanTitle`; the cap reaches only a provider
      // that needs one (see `ModelRequest.maxOutputTokens`). Anthropic's SDK refuses a
      // request that is not streamed with its family's most.
      result = await this.model.complete(
        {
          system: TITLE_SYSTEM,
          messages: [{ role: 'user', content: titleText }],
          tools: [],
          temperature: undefined,
          maxOutputTokens: 64,
        },
        signal,
      );
      span.setAttributes(responseAttributes(result.reason, result.usage));
      await hold
        .settle(result.usage ? (this.costOf(result.usage) ?? 0) : hold.worstCaseUsd)
        .catch(() => undefined);
    } catch (error) {
      failed = { error };
      throw new Error('the model could not title the conversation', {
        // A scrubbed copy: the SDK's error may quote a provider that echoes the key.
        // eslint-disable-next-line preserve-caught-error
        cause: scrubbedError(error, [this.settings.llm.apiKey]),
      });
    } finally {
      endOpenSpan(span, failed, signal.aborted);
      hold.release().catch(() => undefined);
    }
    const title = cleanTitle(result.text);
    if (!title) throw new Error('the model gave an empty title');
    const { usage } = result;
    return usage ? { title, usage: this.usageOutputFields(usage) } : { title };
  }

  /** A span of one model request, in the active trace (the agent step's); its end times the request. */
  private requestSpan(purpose: 'step' | 'title', attempt: number): OpenSpan {
    const startedAt = performance.now();
    const span = startSpan('model request', {
      'gen_ai.operation.name': 'chat',
      'gen_ai.provider.name': this.settings.llm.provider,
      'gen_ai.request.model': this.settings.model,
      'cs.llm.purpose': purpose,
      'cs.llm.attempt': attempt + 1,
    });
    let ended = false;
    return {
      setAttributes: (attributes) => span.setAttributes(attributes),
      end: (error) => {
        if (ended) return;
        ended = true;
        span.end(error);
        try {
          this.onRequestEnded?.((performance.now() - startedAt) / 1000);
        } catch {
          // A metric never fails a request.
        }
      },
    };
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

  /**
   * Holds the worst case of one request in the budgets: the prompt's counted
   * tokens at the input price and `LLM_MAX_OUTPUT_TOKENS` at the output
   * price (`LLM_PRICES` of this model; a model without a price costs 0).
   */
  private async hold(
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

  private costOf(usage: ModelUsage): number | undefined {
    return this.usageOutputFields(usage).cost_usd;
  }

  private usageOutput(usage: ModelUsage): AgentOutput {
    return { type: 'usage', ...this.usageOutputFields(usage) };
  }

  private usageOutputFields(usage: ModelUsage) {
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

/** What a span may say of an answer: its finish reason and token counts. */
function responseAttributes(
  finishReason: string | undefined,
  usage: ModelUsage | undefined,
): Record<string, string | number | string[]> {
  return {
    ...(finishReason === undefined ? {} : { 'gen_ai.response.finish_reasons': [finishReason] }),
    ...(usage
      ? {
          'gen_ai.usage.input_tokens': usage.prompt_tokens,
          'gen_ai.usage.output_tokens': usage.completion_tokens,
        }
      : {}),
  };
}

/**
 * Ends a model request's span: `ok`, `retried` (it failed and is tried
 * again), `aborted` (stop, pause, interrupt, the session closing, the
 * runtime leaving the stream), or `failed`; `retried` and `failed` mark it
 * as an error.
 */
interface RequestOutcome {
  error?: unknown;
  /** It failed and is tried again. */
  retried?: boolean;
  /** Its stream was left before it ended (the runtime stopped reading). */
  abandoned?: boolean;
}

function endOpenSpan(span: OpenSpan, outcome: RequestOutcome, aborted: boolean): void {
  const label =
    outcome.abandoned || (outcome.error !== undefined && aborted)
      ? 'aborted'
      : outcome.error === undefined
        ? 'ok'
        : outcome.retried
          ? 'retried'
          : 'failed';
  span.setAttributes({ 'cs.llm.outcome': label });
  span.end(label === 'ok' || label === 'aborted' ? undefined : outcome.error);
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

/** The first user message and the first agent answer, read from the start. */
async function openingExchange(
  context: AgentContext,
): Promise<{ first: string | undefined; answer: string | undefined }> {
  let first: string | undefined;
  let answer: string | undefined;
  const end = Math.min(context.history.last_event_id, 199);
  for await (const event of context.history.range(0, end)) {
    const text = messageText(event);
    if (text === undefined) continue;
    if (event.source === 'user' && first === undefined) first = text;
    if (event.source === 'agent' && first !== undefined) {
      answer = text;
      break;
    }
  }
  return { first, answer };
}

function messageText(event: StoredEvent): string | undefined {
  if (!isAction(event) || event.action !== 'message') return undefined;
  const content = event.args['content'];
  return typeof content === 'string' ? content : undefined;
}

/** One line, no wrapping quotes, no final period, at most `MAX_MODEL_TITLE_CHARS`. */
export function cleanTitle(text: string): string {
  const line = text
    .trim()
    .split('\n')[0]!
    .replace(/^(title|titre)\s*:\s*/i, '')
    .replace(/^["'“‘«*`]+|["'”’»*`.]+$/g, '')
    .replace(/\.$/, '')
    .replace(/\s+/g, ' ')
    .trim();
  if (line.length <= MAX_MODEL_TITLE_CHARS) return line;
  const cut = cutText(line, MAX_MODEL_TITLE_CHARS);
  const space = cut.lastIndexOf(' ');
  return space > 20 ? cut.slice(0, space) : cut;
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
