import { Queue, type ConnectionOptions } from 'bullmq';
import type { ConversationRef } from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { conversationQueueIndex, conversationQueueNames } from './conversation-queues.js';

/** `trace`: the W3C traceparent of the start (the conversation's first message), for the holder. */
export type ConversationJobData = ConversationRef & { trace?: string };

export interface ConversationJobsOptions {
  /** The starter's W3C traceparent (`currentTraceparent` of libs/observability). */
  traceparent?: () => string | undefined;
  /** `CONVERSATION_QUEUES` (default 1). */
  queueCount?: number;
}

/** One job per conversation: its id is derived from the conversation id. */
export function conversationJobId(conversationId: string): string {
  return `conversation-${conversationId}`;
}

/**
 * Starting a conversation is adding its job to its queue
 * (`conversationQueueIndex`): a second add while the job exists (waiting or
 * active) is a no-op. Finished jobs are removed so that a later start adds a
 * fresh one. Every call names one queue, so one slot.
 */
export class ConversationJobs {
  /** By index (`conversationQueueNames`); they share the given connection. */
  readonly queues: readonly Queue<ConversationJobData>[];

  constructor(
    connection: ConnectionOptions,
    keys: ClusterKeys,
    private readonly options: ConversationJobsOptions = {},
  ) {
    this.queues = conversationQueueNames(options.queueCount ?? 1).map(
      (name) =>
        new Queue<ConversationJobData>(name, {
          connection,
          prefix: keys.bullPrefix,
          defaultJobOptions: { removeOnComplete: true, removeOnFail: true, attempts: 1 },
        }),
    );
  }

  /** The queue of the conversation's job. */
  queueOf(conversationId: string): Queue<ConversationJobData> {
    return this.queues[conversationQueueIndex(conversationId, this.queues.length)]!;
  }

  /**
   * Jobs waiting for a worker in each queue, by index: waiting, delayed
   * (handed back) and prioritized. One call per queue, never two queues' keys
   * in one command.
   */
  waitingCounts(): Promise<number[]> {
    return Promise.all(
      this.queues.map(async (queue) => {
        const counts = await queue.getJobCounts('waiting', 'delayed', 'prioritized');
        return Object.values(counts).reduce((sum, count) => sum + count, 0);
      }),
    );
  }

  async start(ref: ConversationRef): Promise<void> {
    const trace = this.options.traceparent?.();
    await this.queueOf(ref.conversationId).add(
      'run',
      {
        tenantId: ref.tenantId,
        userId: ref.userId,
        conversationId: ref.conversationId,
        incarnation: ref.incarnation,
        ...(trace && { trace }),
      },
      { jobId: conversationJobId(ref.conversationId) },
    );
  }

  /** The state of the conversation's job (`active`: a worker holds it), or null when there is none. */
  async state(conversationId: string): Promise<string | null> {
    const state = await this.queueOf(conversationId).getJobState(conversationJobId(conversationId));
    return state === 'unknown' ? null : state;
  }

  /** Removes the conversation's job unless a worker holds it; true when removed. */
  async cancelQueued(conversationId: string): Promise<boolean> {
    const job = await this.queueOf(conversationId).getJob(conversationJobId(conversationId));
    if (!job) return false;
    const state = await job.getState();
    if (state !== 'waiting' && state !== 'delayed' && state !== 'prioritized') return false;
    try {
      await job.remove();
      return true;
    } catch {
      return false; // taken by a worker meanwhile
    }
  }

  async close(): Promise<void> {
    await Promise.all(this.queues.map((queue) => queue.close()));
  }
}
