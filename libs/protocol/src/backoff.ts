/**
 * The one backoff rule of the service and its SDK: a delay that doubles from
 * `baseMs` with each attempt up to `maxMs`, then scaled by a random factor
 * between `jitter[0]` and `jitter[1]` (none by default). Self-contained: the
 * SDK compiles this file as it is.
 */
export interface Backoff {
  baseMs: number;
  maxMs: number;
  /** The random factor's bounds, e.g. `[0.5, 1]` for "equal jitter". */
  jitter?: readonly [number, number];
}

/** The delay before retry `attempt` (0: the first retry), in whole milliseconds. */
export function backoffDelay(attempt: number, backoff: Backoff): number {
  const [low, high] = backoff.jitter ?? [1, 1];
  const ceiling = Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, attempt));
  return Math.round(ceiling * (low + Math.random() * (high - low)));
}
