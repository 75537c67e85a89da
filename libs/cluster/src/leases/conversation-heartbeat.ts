import { isIdleSince } from '@cs/core';
import type { UserConcurrencyLimiter } from '../limits/user-concurrency.limiter.js';
import type { ConnectionRegistry } from '../realtime/connection-registry.js';
import {
  deliverToHosted,
  describeError,
  idsOf,
  hostedSessions,
  type HostLog,
  type HostedConversation,
  type HostedSession,
} from './hosted-conversation.js';

export interface ConversationHeartbeatDeps {
  limiter: UserConcurrencyLimiter;
  connections: Pick<ConnectionRegistry, 'count'>;
  /** The conversations held here, by id. */
  hosted: ReadonlyMap<string, HostedConversation>;
  idleTimeoutMs: number;
  log: HostLog;
}

/**
 * The worker's beat (every `heartbeatMs`): renews the user slots of the
 * conversations held here, with their last activity, and closes the idle
 * ones (`IDLE_TIMEOUT_MS`, no client attached on any gateway, no turn
 * running). A slot that could not be renewed is taken back or given up.
 */
export class ConversationHeartbeat {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly deps: ConversationHeartbeatDeps) {}

  start(intervalMs: number): void {
    this.timer = setInterval(() => void this.beat(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  async beat(): Promise<void> {
    const { limiter, hosted, log } = this.deps;
    const live = hostedSessions(hosted.values());
    try {
      const lost = await limiter.renew(
        live.map((h) => ({ ...h.ref, lastActivity: h.session.lastActivity })),
      );
      for (const id of lost) {
        const held = hosted.get(id);
        if (held?.session) await this.onSlotLost(held);
      }
      await Promise.all(
        live.map(async (h) => {
          if (await this.isIdle(h)) await h.session.close();
        }),
      );
    } catch (error) {
      log('warn', `heartbeat: ${describeError(error)}`);
    }
  }

  /**
   * A held conversation whose slot is gone: an eviction whose message is on
   * its way, or Redis lost the slot (restarted without persistence). It takes
   * a free slot back, evicting nobody; with none free its user has too many
   * conversations running, and it stops as if evicted.
   */
  private async onSlotLost(hosted: HostedConversation): Promise<void> {
    const { limiter, log } = this.deps;
    const { tenantId, userId, conversationId } = hosted.ref;
    if (await limiter.reclaim(tenantId, userId, conversationId)) {
      log('warn', `slot of ${conversationId} was lost: took a free one back`, idsOf(hosted));
      return;
    }
    log(
      'warn',
      `slot of ${conversationId} was taken, and none is free: stopping it`,
      idsOf(hosted),
    );
    deliverToHosted(hosted, { type: 'evict' });
  }

  private async isIdle({ ref, session }: HostedSession): Promise<boolean> {
    if (session.isMidTurn) return false;
    if (!isIdleSince(session.lastActivity, Date.now(), this.deps.idleTimeoutMs)) return false;
    return (await this.deps.connections.count(ref.conversationId)) === 0;
  }
}
