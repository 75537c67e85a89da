/**
 * What an erasure of a user removes (docs/protocol.md "Data lifecycle"), as a
 * list of steps, one per kind of data. Each step is idempotent: an erasure
 * that resumes after a crash runs them all again from the first, and what
 * was removed already is simply not found. A kind of data added later adds
 * one step here.
 */
import type { DataLifecycleStore, UserKeyEraser } from '@cs/core';
import { StatusId } from '@cs/protocol';
import type { ConversationService } from '../conversations/conversation.service.js';
import type { ConversationSockets } from '../realtime/conversation-sockets.js';

/** Conversations deleted per listing: each is its own short transaction. */
const CONVERSATIONS_PER_BATCH = 50;

/** The erasure a step works for. */
export interface ErasureJob {
  erasureId: string;
  tenantId: string;
  userId: string;
  /** Extends the runner's lease; throws when another runner took the erasure over. */
  renew(): Promise<void>;
}

export interface ErasureStep {
  /** For logs: which kind of data. */
  name: string;
  run(job: ErasureJob): Promise<void>;
}

export interface ErasureStepDeps {
  conversations: ConversationService;
  lifecycle: DataLifecycleStore;
  sockets: ConversationSockets;
  /** Redis in a cluster; none in the standalone process. */
  keys: UserKeyEraser | null;
}

/**
 * The steps, in order. Conversations first (each stopped, then deleted with
 * its events and state, its sockets and streams closed on every gateway, its
 * Redis keys dropped), listed again until none is left, so that one the
 * user creates meanwhile goes too; then what spans conversations.
 */
export function erasureSteps(deps: ErasureStepDeps): ErasureStep[] {
  return [
    {
      name: 'conversations',
      async run(job) {
        for (;;) {
          const batch = await deps.lifecycle.userConversations(
            job.tenantId,
            job.userId,
            CONVERSATIONS_PER_BATCH,
          );
          if (batch.length === 0) return;
          for (const ref of batch) {
            await deps.conversations.remove(ref, { erasureId: job.erasureId });
            await deps.keys?.forgetConversation(ref.conversationId);
            await job.renew();
          }
        }
      },
    },
    {
      name: 'user-state',
      run: (job) => deps.lifecycle.deleteUserState(job.tenantId, job.userId),
    },
    {
      // Sockets of the user on conversations that are not theirs (an admin's).
      name: 'connections',
      run(job) {
        deps.sockets.closeUser(job.tenantId, job.userId, {
          status_update: true,
          type: 'error',
          id: StatusId.ConversationDeleted,
          message: "the user's data was erased",
        });
        return Promise.resolve();
      },
    },
    {
      name: 'redis-keys',
      run: async (job) => {
        await deps.keys?.forgetUser(job.tenantId, job.userId);
      },
    },
    {
      // After the conversations: their deletions enqueued `conversation.deleted`.
      name: 'webhook-deliveries',
      run: (job) => deps.lifecycle.deleteUserWebhookDeliveries(job.tenantId, job.userId),
    },
    {
      name: 'usage',
      run: (job) => deps.lifecycle.eraseFromUsage(job.tenantId, job.userId),
    },
    {
      // Last: the erasure's own record names the user until here.
      name: 'audit',
      run: (job) => deps.lifecycle.eraseFromAudit(job.tenantId, job.userId),
    },
  ];
}
