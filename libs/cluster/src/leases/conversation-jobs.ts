import { Queue, type ConnectionOptions } from 'bullmq';
import type { ConversationRef } from '@cs/core';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/** The BullMQ queue whose active jobs are conversation leases; its tag keeps it in one slot. */
export const CONVERSATION_QUEUE = '{conversations}';

/** `trace`: the W3C traceparent of the start (the conversation's first message), for the holder. */
export type ConversationJobData = ConversationRef & { trace?: string };

export interface ConversationJobsOptions {
  /** The starter's W3C traceparent (`currentTraceparent` of libs/observability). */
  traceparent?: () => string | undefined;
}

/** One job per conversation: its id is derived from the conversation id. */
export function conversationJobId(conversationId: string): string {
  return `conversation-${conversationId}`;
}

/**
 * Starting a conversation is adding its job: a second add while the job
 * exists (waiting or active) is a no-op. Finished jobs are removed so that a
 * later start adds a fresh one.
 */
export class ConversationJobs {
  readonly queue: Queue<ConversationJobData>;

  constructor(
    connection: ConnectionOptions,
    keys: ClusterKeys,
    private readonly options: ConversationJobsOptions = {},
  ) {
    this.queue = new Queue<ConversationJobData>(CONVERSATION_QUEUE, {
      connection,
      prefix: keys.bullPrefix,
      defaultJobOptions: { removeOnComplete: true, removeOnFail: true, attempts: 1 },
    });
  }

  async start(ref: ConversationRef): Promise<void> {
    const trace = this.options.traceparent?.();
    await this.queue.add(
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
    const state = await this.queue.getJobState(conversationJobId(conversationId));
    return state === 'unknown' ? null : state;
  }

  /** Removes the conversation's job unless a worker holds it; true when removed. */
  async cancelQueued(conversationId: string): Promise<boolean> {
    const job = await this.queue.getJob(conversationJobId(conversationId));
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

  close(): Promise<void> {
    return this.queue.close();
  }
}
