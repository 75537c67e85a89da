/**
 * BullMQ's lock and stall timings derived from `LEASE_TTL_MS`, identical on
 * every process (the stalled check is throttled queue-wide by whichever
 * worker ran it last). A killed holder's job is back in the queue at most
 * `lockDuration + stalledInterval` = `LEASE_TTL_MS` after its last renewal.
 */
export interface LeaseTiming {
  lockDuration: number;
  lockRenewTime: number;
  stalledInterval: number;
  /** How long a user's slot lives without renewal by its holder. */
  slotTtlMs: number;
  /** How often a worker renews its slots and checks idle conversations. */
  heartbeatMs: number;
}

export function leaseTiming(leaseTtlMs: number): LeaseTiming {
  const stalledInterval = Math.max(500, Math.min(5_000, Math.floor(leaseTtlMs / 5)));
  const lockDuration = leaseTtlMs - stalledInterval;
  return {
    lockDuration,
    // Renew often: a renewal that misses one beat must not lose the lease.
    lockRenewTime: Math.max(250, Math.floor(lockDuration / 4)),
    stalledInterval,
    slotTtlMs: 2 * leaseTtlMs,
    heartbeatMs: Math.max(250, Math.floor(leaseTtlMs / 5)),
  };
}
