/**
 * What the conversation managers and the worker host report for metrics
 * (PROTOCOL.md "Operations"), implemented on Prometheus in
 * `libs/observability` (`ServiceMetrics.cluster()`). Every method must never
 * throw; `NO_CLUSTER_METRICS` does nothing.
 */
export interface ClusterMetrics {
  /** A worker (or the standalone process) took a conversation's lease (`cs_lease_acquisitions_total`). */
  leaseAcquired(): void;
  /** The lease was taken over from a holder that crashed or lost it (`cs_failovers_total`). */
  failover(): void;
  /** A draining worker handed a lease back to the queue (`cs_handoffs_total`). */
  handoff(): void;
  /**
   * Seconds from the wake-up being sent (a user event stored, a job added) to
   * its holder picking it up (`cs_wakeup_pickup_seconds`).
   */
  wakeupPickedUp(seconds: number): void;
  /** `evict_oldest` stopped a conversation to make room (`cs_limit_evictions_total`). */
  limitEviction(): void;
  /** `reject` refused a start with CONCURRENCY_LIMIT_REACHED (`cs_limit_rejections_total`). */
  limitRejection(): void;
}

export const NO_CLUSTER_METRICS: ClusterMetrics = {
  leaseAcquired: () => undefined,
  failover: () => undefined,
  handoff: () => undefined,
  wakeupPickedUp: () => undefined,
  limitEviction: () => undefined,
  limitRejection: () => undefined,
};
