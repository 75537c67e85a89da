/**
 * The conversation's BullMQ job as its lease, through BullMQ's public API
 * only. The worker renews no lock itself (`skipLockRenewal`): each run of a
 * job has its lock renewed by its own token (`JobLeases`, all of one queue
 * in one `worker.extendJobLocks` call).
 *
 * Why per run: BullMQ hands a job out again when its lock lapsed (this
 * process was paused, or Redis was away, past the lock), possibly to the
 * worker still running it, so two runs of one job may overlap here. A
 * renewal kept by job id would be dropped when the earlier run finishes,
 * with the newer run's lock going unrenewed: it would lapse, and the job be
 * handed out again and again (each time a failover) until the conversation
 * ended in `too_many_failovers`. A renewal by token belongs to its run: the
 * earlier run's stops failing (its token is stale), the newer run's goes on.
 */
import { WaitingError, Worker, type ConnectionOptions, type Job } from 'bullmq';
import type { ConversationJobData } from './conversation-jobs.js';
import type { LeaseTiming } from './lease-timing.js';

export type ConversationJob = Job<ConversationJobData, string>;

export interface ConversationWorkerOptions {
  connection: ConnectionOptions;
  prefix: string;
  concurrency: number;
  timing: LeaseTiming;
}

/** The BullMQ worker of one conversation queue; `process` runs as long as the lease is held. */
export function conversationWorker(
  queueName: string,
  process: (job: ConversationJob, token: string) => Promise<string>,
  options: ConversationWorkerOptions,
): Worker<ConversationJobData, string> {
  const { timing } = options;
  return new Worker<ConversationJobData, string>(
    queueName,
    (job, token) => {
      // BullMQ's Worker passes the run's lock token to every processor.
      if (token === undefined) throw new Error('a conversation job runs only with its lock token');
      return process(job, token);
    },
    {
      connection: options.connection,
      prefix: options.prefix,
      concurrency: options.concurrency,
      lockDuration: timing.lockDuration,
      lockRenewTime: timing.lockRenewTime,
      // Each run has its own lock renewed (JobLeases); the stalled check still runs, so a
      // dead process's job is handed out again once its lock lapsed.
      skipLockRenewal: true,
      stalledInterval: timing.stalledInterval,
      // Repeated crashes are bounded by our failover accounting, not by failing the job for good.
      maxStalledCount: Number.MAX_SAFE_INTEGER,
      // An idle worker looks for jobs at least this often (seconds): a worker shutting
      // down may take the wake-up marker of the jobs it hands back, and the others must
      // not wait for the next one.
      drainDelay: 0.2,
    },
  );
}

/**
 * Hands the job back to the queue (SIGTERM, or taken while draining), so
 * that another worker takes it at once. Never returns: BullMQ needs the
 * `WaitingError` to leave the job waiting rather than finish it.
 */
export async function handBack(job: ConversationJob, token: string): Promise<never> {
  await job.moveToWait(token);
  throw new WaitingError();
}

export interface JobLeaseEvents {
  /**
   * A renewal found the lock gone or held by another run's token: another
   * worker may have the conversation now, or Redis only lost the lock.
   */
  onLockLost: () => void;
  /** A renewal failed (Redis away); the next one tries again. */
  onError: (error: unknown) => void;
}

/**
 * Renews the locks of many runs of one queue in one call: the queue's
 * worker's public `extendJobLocks` (one Lua script for all of them, as
 * BullMQ's own lock renewal does), resolving with the ids of the jobs whose
 * lock it could not renew (gone, or held by another token).
 */
export type ExtendLocks = (
  queueName: string,
  jobIds: string[],
  tokens: string[],
  duration: number,
) => Promise<string[]>;

/**
 * The job locks of the runs in this process, renewed together every
 * `lockRenewTime` (one Redis call per queue however many conversations are
 * held: a queue's keys are in one slot, two queues' are not), each by its
 * own run's token. Of two runs of one job (a stalled job handed out
 * again to this worker), only the newer one's lock is renewed: the earlier
 * run's token is stale by then, and that run is ending.
 */
export class JobLeases {
  private readonly held = new Set<JobLease>();
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private renewing = false;

  constructor(
    private readonly timing: Pick<LeaseTiming, 'lockDuration' | 'lockRenewTime'>,
    private readonly extendLocks: ExtendLocks,
  ) {}

  /** Starts renewing the lock of this run of the job, from the next renewal on. */
  hold(job: ConversationJob, token: string, events: JobLeaseEvents): JobLease {
    const lease = new JobLease(job, token, events, () => this.drop(lease));
    if (this.closed) {
      lease.release();
      return lease;
    }
    this.held.add(lease);
    this.timer ??= setInterval(() => void this.renew(), this.timing.lockRenewTime);
    return lease;
  }

  /** Stops every renewal: the locks lapse and the stalled check hands the jobs out again. */
  releaseAll(): void {
    this.closed = true;
    for (const lease of [...this.held]) lease.release();
  }

  private drop(lease: JobLease): void {
    this.held.delete(lease);
    if (this.held.size > 0) return;
    clearInterval(this.timer);
    this.timer = undefined;
  }

  private async renew(): Promise<void> {
    if (this.renewing) return; // the last renewal is still under way
    // The newest run of each job (a Set keeps the order runs were held in).
    const newest = new Map<string, JobLease>();
    for (const lease of this.held) newest.set(lease.jobId, lease);
    if (newest.size === 0) return;
    const byQueue = new Map<string, JobLease[]>();
    for (const lease of newest.values()) {
      const queue = byQueue.get(lease.queueName);
      if (queue) queue.push(lease);
      else byQueue.set(lease.queueName, [lease]);
    }
    this.renewing = true;
    try {
      await Promise.all(
        [...byQueue].map(([queueName, leases]) => this.renewQueue(queueName, leases)),
      );
    } finally {
      this.renewing = false;
    }
  }

  private async renewQueue(queueName: string, leases: readonly JobLease[]): Promise<void> {
    try {
      const failed = new Set(
        await this.extendLocks(
          queueName,
          leases.map((lease) => lease.jobId),
          leases.map((lease) => lease.token),
          this.timing.lockDuration,
        ),
      );
      for (const lease of leases)
        if (failed.has(lease.jobId) && !lease.isReleased) lease.events.onLockLost();
    } catch (error) {
      for (const lease of leases) if (!lease.isReleased) lease.events.onError(error);
    }
  }
}

/** One run's hold of its job's lock. */
export class JobLease {
  private released = false;

  constructor(
    readonly job: ConversationJob,
    readonly token: string,
    readonly events: JobLeaseEvents,
    private readonly onRelease: () => void,
  ) {}

  get jobId(): string {
    // BullMQ gives every job it hands out an id.
    return this.job.id ?? '';
  }

  /** The queue the job is in: its lock is renewed with the others of that queue. */
  get queueName(): string {
    return this.job.queueName;
  }

  get isReleased(): boolean {
    return this.released;
  }

  /** Stops renewing (the run ends); the lock goes with the job's completion or lapses. */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.onRelease();
  }

  /** Stops renewing and hands the job back to the queue (see `handBack`). */
  handBack(): Promise<never> {
    this.release();
    return handBack(this.job, this.token);
  }
}
