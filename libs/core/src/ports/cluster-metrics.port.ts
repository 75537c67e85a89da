/**
 * What the conversation managers and the worker host report for metrics
 * (docs/protocol.md "Operations"), implemented on Prometheus in
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
  /**
   * `evict_oldest` chose a conversation to stop to make room
   * (`cs_limit_evictions_total`). Counted once, by the process that decided
   * it: the standalone manager, or the gateway whose slot acquire evicted it
   * (not the worker that then stops it).
   */
  limitEviction(): void;
  /**
   * The per-user limit refused a start with CONCURRENCY_LIMIT_REACHED
   * (`reject`; `cs_limit_rejections_total`). Counted once per refusal, by
   * the process that decided it.
   */
  limitRejection(): void;
  /**
   * The worker's reconciler started a live conversation whose job Redis had
   * lost (`cs_conversations_reconciled_total`).
   */
  reconciled(): void;
}

export const NO_CLUSTER_METRICS: ClusterMetrics = {
  leaseAcquired: () => undefined,
  failover: () => undefined,
  handoff: () => undefined,
  wakeupPickedUp: () => undefined,
  limitEviction: () => undefined,
  limitRejection: () => undefined,
  reconciled: () => undefined,
};
