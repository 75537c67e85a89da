import { Worker, type Job } from 'bullmq';
import type { ConversationJobData } from './conversation-jobs.js';

/**
 * The BullMQ worker of the conversation queue. BullMQ hands a job out again
 * when its lock lapsed (this process was paused, or Redis was away, past the
 * lock), possibly to the worker still running it: two runs of one job then
 * overlap here. BullMQ tracks lock renewals by job id, so when the earlier run
 * finishes it stops renewing the newer run's lock too; that lock would lapse,
 * the job would be handed out again and again (each time a failover) until the
 * conversation ended in `too_many_failovers`. This worker tracks the newer run
 * again once the earlier one is done.
 */
export class ConversationWorker extends Worker<ConversationJobData> {
  /** The token of the latest run of each job processed here. */
  private readonly latestRun = new Map<string, string>();

  override async processJob(
    job: Job<ConversationJobData>,
    token: string,
    fetchNextCallback?: () => boolean,
  ): Promise<void | Job<ConversationJobData>> {
    const jobId = job.id;
    if (jobId === undefined) return super.processJob(job, token, fetchNextCallback);
    this.latestRun.set(jobId, token);
    try {
      return await super.processJob(job, token, fetchNextCallback);
    } finally {
      const latest = this.latestRun.get(jobId);
      if (latest === token) {
        this.latestRun.delete(jobId);
      } else if (latest !== undefined) {
        // An old timestamp: renewed at the lock manager's next tick.
        const renewEvery = this.opts.lockRenewTime ?? 0;
        this.lockManager.trackJob(jobId, latest, Date.now() - renewEvery);
      }
    }
  }
}
