/**
 * When to try a delivery again (docs/protocol.md "Webhooks"): 1 s after the first
 * failed attempt, doubling each time, at most 1 h, each delay jittered
 * between 75 % and 100 % of its value so that deliveries that failed
 * together (an endpoint down) do not all come back at the same instant.
 */
import { backoffDelay } from '@cs/protocol';

const FIRST_DELAY_MS = 1_000;
const LONGEST_DELAY_MS = 3_600_000;

/** The delay before the attempt after `failedAttempts` failed ones (1, 2, …). */
export function retryDelayMs(failedAttempts: number, random: () => number = Math.random): number {
  return backoffDelay(Math.min(failedAttempts - 1, 32), {
    baseMs: FIRST_DELAY_MS,
    maxMs: LONGEST_DELAY_MS,
    jitter: [0.75, 1],
    random,
  });
}
