import type { ConversationStore } from '@cs/core';
import {
  describeError,
  hostedSessions,
  type HostLog,
  type HostedConversation,
} from './hosted-conversation.js';

/** How often the hosted sessions are checked for lost wake-ups. */
export const CATCH_UP_INTERVAL_MS = 3_000;

/**
 * A wake-up lost (Redis away, a holder just subscribing) must delay a
 * message, never lose it: one read of every hosted conversation's last
 * event id finds the sessions that are behind, and only those read. A
 * session that failed to write (Postgres away) is woken to try again.
 * (Sessions here poll nothing themselves: `catchUpIntervalMs: 0`.)
 */
export class LostWakeUpCatchUp {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly store: Pick<ConversationStore, 'lastEventIds'>,
    private readonly hosted: () => Iterable<HostedConversation>,
    private readonly log: HostLog,
  ) {}

  start(intervalMs = CATCH_UP_INTERVAL_MS): void {
    this.timer = setInterval(() => void this.catchUp(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  async catchUp(): Promise<void> {
    const live = hostedSessions(this.hosted());
    if (live.length === 0) return;
    try {
      const latest = await this.store.lastEventIds(live.map((hosted) => hosted.ref));
      for (const { ref, session } of live) {
        const last = latest.get(ref.conversationId);
        if (session.wantsRetry || (last !== undefined && last > session.lastEventId))
          session.wake();
      }
    } catch (error) {
      this.log('warn', `catch-up: ${describeError(error)}`);
    }
  }
}
