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
 * How often, and for how long after the last sign of it, they are checked
 * while wake-ups are being lost (the inbox's subscription dropped: Redis
 * restarting, a Redis Cluster master failing over): a message whose wake-up
 * failed waits a quarter of a second for its answer, not three.
 */
export const HURRIED_CATCH_UP_INTERVAL_MS = 250;
export const HURRIED_CATCH_UP_WINDOW_MS = 15_000;

/**
 * A wake-up lost (Redis away, a holder just subscribing) must delay a
 * message, never lose it: one read of every hosted conversation's last
 * event id finds the sessions that are behind, and only those read. A
 * session that failed to write (Postgres away) is woken to try again.
 * (Sessions here poll nothing themselves: `catchUpIntervalMs: 0`.)
 */
export class LostWakeUpCatchUp {
  private timer: NodeJS.Timeout | undefined;
  private hurryTimer: NodeJS.Timeout | undefined;
  private hurriedUntil = 0;
  private stopped = false;
  /** The pass under way: a pass never starts while another runs. */
  private running: Promise<void> | null = null;

  constructor(
    private readonly store: Pick<ConversationStore, 'lastEventIds'>,
    private readonly hosted: () => Iterable<HostedConversation>,
    private readonly log: HostLog,
  ) {}

  start(intervalMs = CATCH_UP_INTERVAL_MS): void {
    this.stopped = false;
    this.timer = setInterval(() => void this.catchUp(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    this.stopHurrying();
  }

  /** Wake-ups may be getting lost: check every `HURRIED_CATCH_UP_INTERVAL_MS` for a while. */
  hurry(): void {
    if (this.stopped) return;
    this.hurriedUntil = Date.now() + HURRIED_CATCH_UP_WINDOW_MS;
    if (this.hurryTimer) return;
    this.hurryTimer = setInterval(() => {
      if (Date.now() > this.hurriedUntil) this.stopHurrying();
      else void this.catchUp();
    }, HURRIED_CATCH_UP_INTERVAL_MS);
    this.hurryTimer.unref();
  }

  private stopHurrying(): void {
    clearInterval(this.hurryTimer);
    this.hurryTimer = undefined;
  }

  catchUp(): Promise<void> {
    this.running ??= this.pass().finally(() => (this.running = null));
    return this.running;
  }

  private async pass(): Promise<void> {
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
