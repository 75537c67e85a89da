/**
 * The trace of one user message crosses processes twice: from the gateway to
 * the worker through the BullMQ job (the conversation's first message) or the
 * inbox wake-up (the next ones). Each carries the W3C `traceparent` of the
 * span that stored the message; the worker continues that trace with it.
 * Only `@opentelemetry/api` here: without a started SDK every call is a
 * cheap no-op (no traceparent, spans that record nothing).
 */
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  context,
  propagation,
  trace,
  type Attributes,
  type Span,
} from '@opentelemetry/api';

export const TRACER_NAME = 'conversation-service';

const tracer = () => trace.getTracer(TRACER_NAME);

/** The W3C traceparent of the active span, or undefined when nothing is traced. */
export function currentTraceparent(): string | undefined {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return carrier.traceparent;
}

/**
 * Runs `fn` in a new span that continues the trace of `traceparent` (from a
 * job or a wake-up), or the active trace when there is none. The span ends
 * when `fn` settles; a throw marks it as an error and is rethrown.
 */
export function withRemoteParent<T>(
  traceparent: string | undefined,
  name: string,
  fn: () => Promise<T>,
  attributes: Attributes = {},
): Promise<T> {
  const parent = traceparent
    ? propagation.extract(ROOT_CONTEXT, { traceparent })
    : context.active();
  return run(name, SpanKind.CONSUMER, attributes, parent, fn);
}

/**
 * The synchronous kind of `withRemoteParent`, for a hand-over that only
 * delivers (an inbox wake-up): `fn` runs in a span of the sender's trace,
 * which ends when `fn` returns.
 */
export function continueTrace(
  traceparent: string,
  name: string,
  fn: () => void,
  attributes: Attributes = {},
): void {
  const parent = propagation.extract(ROOT_CONTEXT, { traceparent });
  tracer().startActiveSpan(name, { kind: SpanKind.CONSUMER, attributes }, parent, (span: Span) => {
    try {
      fn();
    } finally {
      span.end();
    }
  });
}

/** Runs `fn` in a child span of the active one (an agent step, a tool call, a model request). */
export function withSpan<T>(
  name: string,
  fn: () => Promise<T>,
  attributes: Attributes = {},
): Promise<T> {
  return run(name, SpanKind.INTERNAL, attributes, context.active(), fn);
}

/** A span begun by `startSpan`: attributes added as they become known, then ended once. */
export interface OpenSpan {
  setAttributes(attributes: Attributes): void;
  /** Ends the span, marked as an error when `error` is given. Later calls do nothing. */
  end(error?: unknown): void;
}

/**
 * Begins a child span of the active one, for work that does not fit in one
 * callback (a model request streamed through an async generator, whose
 * chunks are yielded between its start and its end). The caller ends it.
 */
export function startSpan(name: string, attributes: Attributes = {}): OpenSpan {
  const span = tracer().startSpan(name, { kind: SpanKind.CLIENT, attributes }, context.active());
  let ended = false;
  return {
    setAttributes: (more) => {
      if (!ended) span.setAttributes(more);
    },
    end: (error) => {
      if (ended) return;
      ended = true;
      if (error !== undefined) {
        // The error's name only: a provider's message may quote the prompt or the key.
        span.setStatus({
          code: SpanStatusCode.ERROR,
          message: error instanceof Error ? error.name : 'error',
        });
      }
      span.end();
    },
  };
}

function run<T>(
  name: string,
  kind: SpanKind,
  attributes: Attributes,
  parent: ReturnType<typeof context.active>,
  fn: () => Promise<T>,
): Promise<T> {
  return tracer().startActiveSpan(name, { kind, attributes }, parent, async (span: Span) => {
    try {
      return await fn();
    } catch (error) {
      span.recordException(error instanceof Error ? error : String(error));
      span.setStatus({ code: SpanStatusCode.ERROR });
      throw error;
    } finally {
      span.end();
    }
  });
}

/**
 * The three calls above as one object, for a component that receives its
 * tracing as a dependency (libs/core and libs/cluster import no tracing
 * library): `{ currentTraceparent, withRemoteParent, withSpan }`.
 */
export const traceContext = { currentTraceparent, withRemoteParent, withSpan, continueTrace };
export type TraceContext = typeof traceContext;
