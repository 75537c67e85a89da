/**
 * What the agent runtime reports for metrics (docs/protocol.md "Operations"),
 * implemented on Prometheus in `libs/observability`. Every method is optional
 * to call and must never throw.
 */
export interface RuntimeMetrics {
  /** One agent step ran (`cs_agent_step_seconds`). */
  stepFinished(seconds: number): void;
  /**
   * One tool call ended (`cs_tool_calls_total{tool,outcome}`); outcome: ok, error, rejected,
   * in_doubt, timeout, and for a turn ended by a stop, pause or interrupt, cancelled (cut while
   * it ran) or not_run (it never started).
   */
  toolCalled(
    tool: string,
    outcome: 'ok' | 'error' | 'rejected' | 'in_doubt' | 'timeout' | 'cancelled' | 'not_run',
  ): void;
  /** Tokens a model request used (`cs_llm_tokens_total{kind}`). */
  tokensUsed(prompt: number, completion: number): void;
}

export const NO_RUNTIME_METRICS: RuntimeMetrics = {
  stepFinished: () => undefined,
  toolCalled: () => undefined,
  tokensUsed: () => undefined,
};
