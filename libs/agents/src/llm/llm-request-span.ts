/**
 * Each model request of the `llm` agent (each attempt of a step, and the
 * title request) is a `model request` span, a child of the agent step's span
 * in the message's trace: provider, model, attempt, finish reason and token
 * counts only — never the prompt, the answer, the key or the provider's
 * error text. Its end times the request (`cs_llm_request_seconds`).
 */
import { startSpan, type OpenSpan } from '@cs/observability';
import type { ModelUsage } from './model-client.js';

/** The spans of one conversation's model requests. */
export class RequestSpans {
  constructor(
    private readonly provider: string,
    private readonly model: string,
    /** Told the duration of each model request, in seconds. */
    private readonly onRequestEnded: ((seconds: number) => void) | undefined,
  ) {}

  /** A span of one model request, in the active trace (the agent step's); its end times the request. */
  start(purpose: 'step' | 'title', attempt: number): OpenSpan {
    const startedAt = performance.now();
    const span = startSpan('model request', {
      'gen_ai.operation.name': 'chat',
      'gen_ai.provider.name': this.provider,
      'gen_ai.request.model': this.model,
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
}

/** What a span may say of an answer: its finish reason and token counts. */
export function responseAttributes(
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
 * How a model request ended, for its span: `ok`, `retried` (it failed and is
 * tried again), `aborted` (stop, pause, interrupt, the session closing, the
 * runtime leaving the stream), or `failed`.
 */
export interface RequestOutcome {
  error?: unknown;
  /** It failed and is tried again. */
  retried?: boolean;
  /** Its stream was left before it ended (the runtime stopped reading). */
  abandoned?: boolean;
}

/** Ends a model request's span with its outcome; `retried` and `failed` mark it as an error. */
export function endRequestSpan(span: OpenSpan, outcome: RequestOutcome, aborted: boolean): void {
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
