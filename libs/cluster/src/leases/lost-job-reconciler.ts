import {
  ConcurrencyLimitError,
  NO_CLUSTER_METRICS,
  isLiveStatus,
  type ClusterMetrics,
  type ConversationManager,
  type ConversationRef,
  type ConversationStore,
} from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ConversationJobs } from './conversation-jobs.js';
import type { ConversationStops } from './conversation-stops.js';
import { describeError, type HostLog } from './hosted-conversation.js';

/** Live conversations read per page, and job states asked per batch. */
export const RECONCILE_PAGE = 200;

export interface LostJobReconcilerDeps {
  store: Pick<ConversationStore, 'listLiveConversations' | 'getConversation'>;
  jobs: Pick<ConversationJobs, 'state'>;
  stops: Pick<ConversationStops, 'read'>;
  /**
   * Starts a conversation as a gateway does (`ClusteredConversationManager`:
   * its user's slot, STARTING, the job), and stops it again when a stop
   * landed meanwhile.
   */
  manager: Pick<ConversationManager, 'ensureRunning' | 'stop'>;
  redis: Pick<RedisConnection, 'set'>;
  keys: ClusterKeys;
  workerId: string;
  /** `LEASE_TTL_MS`. */
  leaseTtlMs: number;
  log: HostLog;
  metrics?: ClusterMetrics;
  /** Jitter in [0, 1) (tests). */
  random?: () => number;
}

/**
 * Postgres is the truth of which conversations are live (STARTING or
 * RUNNING); Redis holds their jobs, and may lose some: replication is
 * asynchronous, so a master killed before its replica got a write loses it
 * (the job, or its move to active), and a Redis restarted without
 * persistence loses every job. Such a conversation has a stored message to
 * answer, or a client that expects it to run, and nobody to run it: no
 * holder's stalled job comes back, no gateway starts it again until the next
 * message.
 *
 * Every `2 × LEASE_TTL_MS` (jittered by ±25 %), each worker tries to take the
 * reconciler lock (`SET NX PX`, one slot of its own) for `LEASE_TTL_MS`; the
 * one that gets it pages through the live conversations idle for more than a
 * lease TTL (one indexed query per page: a live holder writes far more often
 * than that while it works, and the queue knows the others), asks their jobs'
 * state in batches, and starts again, as a gateway would, those whose job is
 * gone. One worker a pass, not a share each: a pass is one cheap scan, and the
 * lock's TTL spaces passes evenly however many workers run. A job that is gone
 * while its holder still runs is a holder nobody would take over when it
 * dies: it is started again too, and the new holder's lease epoch fences the
 * old one out, so each message is still answered once.
 */
export class LostJobReconciler {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private pass: Promise<void> = Promise.resolve();

  constructor(private readonly deps: LostJobReconcilerDeps) {}

  /** How long between two passes, before jitter. */
  get intervalMs(): number {
    return 2 * this.deps.leaseTtlMs;
  }

  start(): void {
    this.stopped = false;
    this.schedule();
  }

  /** Stops the timer and waits for a pass under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.pass;
  }

  private schedule(): void {
    if (this.stopped) return;
    const random = this.deps.random ?? Math.random;
    const delay = Math.round(this.intervalMs * (0.75 + 0.5 * random()));
    this.timer = setTimeout(() => {
      this.pass = this.runIfLocked()
        .then(() => undefined)
        .catch((error: unknown) => this.deps.log('warn', `reconciler: ${describeError(error)}`))
        .finally(() => this.schedule());
    }, delay);
    this.timer.unref();
  }

  /** One pass, on the worker that takes the lock. Resolves with how many it started. */
  async runIfLocked(): Promise<number> {
    const { redis, keys, workerId } = this.deps;
    // Half the interval: one worker alone runs every pass; many run one about every half interval.
    const taken = await redis.set(keys.reconcilerLock, workerId, 'PX', this.intervalMs / 2, 'NX');
    return taken === 'OK' ? this.reconcile() : 0;
  }

  /** Checks every live conversation idle for more than a lease TTL; resolves with how many it started. */
  async reconcile(): Promise<number> {
    const { store, jobs } = this.deps;
    const idleBefore = new Date(Date.now() - this.deps.leaseTtlMs);
    let started = 0;
    let afterId: string | null = null;
    for (;;) {
      const page = await store.listLiveConversations({
        idleBefore,
        afterId,
        limit: RECONCILE_PAGE,
      });
      const states = await Promise.all(page.map((ref) => jobs.state(ref.conversationId)));
      for (const [index, ref] of page.entries()) {
        if (states[index] !== null || this.stopped) continue;
        if (await this.repair(ref, idleBefore)) started += 1;
      }
      if (page.length < RECONCILE_PAGE || this.stopped) return started;
      afterId = page[page.length - 1]!.conversationId;
    }
  }

  /**
   * Starts a live conversation whose job was not found, unless it changed
   * meanwhile: a run that ends sets the status before its job goes, a start
   * adds the job after STARTING, a stop moves the stop mark first.
   */
  private async repair(ref: ConversationRef, idleBefore: Date): Promise<boolean> {
    const { store, jobs, stops, manager, log, metrics = NO_CLUSTER_METRICS } = this.deps;
    const id = ref.conversationId;
    try {
      const stopMark = await stops.read(id);
      const record = await store.getConversation(ref.tenantId, id);
      if (!record || record.incarnation !== ref.incarnation) return false;
      if (!isLiveStatus(record.status) || record.updatedAt >= idleBefore) return false;
      if ((await jobs.state(id)) !== null) return false;
      log('warn', `conversation ${id} is ${record.status} but its job is gone: starting it again`, {
        conversation_id: id,
        tenant_id: ref.tenantId,
      });
      await manager.ensureRunning(ref);
      metrics.reconciled();
      // A stop that landed while this started it: it stays stopped.
      if ((await stops.read(id)) !== stopMark) await manager.stop(ref);
      return true;
    } catch (error) {
      // No slot free (`reject`): it stays live in Postgres, and the next pass tries again.
      const why = error instanceof ConcurrencyLimitError ? 'its user has no slot free' : '';
      log('warn', `reconciler: conversation ${id}: ${why || describeError(error)}`, {
        conversation_id: id,
      });
      return false;
    }
  }
}
