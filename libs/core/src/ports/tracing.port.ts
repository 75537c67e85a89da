/**
 * How the agent runtime takes part in a user message's trace (docs/protocol.md
 * "Operations"): the trace is read where the message's wake-up arrives, and
 * its turn, steps and tool calls are spans of it. Implemented on
 * OpenTelemetry in `libs/observability` (`traceContext`); a pass-through by
 * default.
 */
export interface Tracing {
  /** The active trace as a W3C traceparent, if any. */
  currentTraceparent(): string | undefined;
  /** Runs `fn` in a span continuing `traceparent` (or the active trace when none). */
  withRemoteParent<T>(
    traceparent: string | undefined,
    name: string,
    fn: () => Promise<T>,
    attributes?: Record<string, string | number>,
  ): Promise<T>;
  /** Runs `fn` in a child span of the active one. */
  withSpan<T>(
    name: string,
    fn: () => Promise<T>,
    attributes?: Record<string, string | number>,
  ): Promise<T>;
}

export const NO_TRACING: Tracing = {
  currentTraceparent: () => undefined,
  withRemoteParent: (_traceparent, _name, fn) => fn(),
  withSpan: (_name, fn) => fn(),
};
