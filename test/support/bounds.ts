// How the end-to-end files bound a timed step. They run two at a time, beside
// other files' processes, on two cores, where a process may wait seconds for
// a core. The contract's figures (failover within LEASE_TTL_MS + 2 s, a
// hand-off within 2 s, a stop within 1 s) are measured by `npm run bench`; a
// test's bound only tells a working mechanism from a broken one, whose
// fallback takes far longer (a 20 s turn run out, a model that never ends, a
// lease left to lapse, a drain's 9 s deadline).

/** What a bound measured from outside may exceed the contract's by (polling, scheduling, a busy machine). */
export const SLACK_MS = 4_000;
/** A step the contract bounds by 1 s: a stop or an interrupt reaching the agent or the model. */
export const PROMPTLY_MS = 1_000 + SLACK_MS;
/**
 * The pause between a streamed step's deltas in the tests that join it
 * mid-step: long enough that a client connecting after its first few deltas
 * still finds it running on a busy machine (a 20-delta step lasts 3 s).
 */
export const MID_STEP_DELAY_MS = 150;
