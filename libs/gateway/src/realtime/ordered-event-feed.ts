import type { EventPage } from '@cs/core';
import type { StoredEvent } from '@cs/protocol';

/**
 * Reads a page of stored events `fromId..toId` (inclusive; toId open when
 * undefined), in id order; `hasMore` when the range holds more.
 */
export type EventPageReader = (
  fromId: number,
  toId: number | undefined,
  limit: number,
) => Promise<EventPage>;

export interface OrderedEventFeedOptions {
  /** The last id the subscriber already has (-1 for none). */
  afterId: number;
  read: EventPageReader;
  send: (event: StoredEvent) => void;
  /**
   * Awaited before each page is read: a subscriber whose client is slow
   * makes the replay wait rather than buffer the history.
   */
  beforePage?: () => Promise<void>;
  /** How long an out-of-order live event waits for the ones before it. */
  gapWaitMs?: number;
  pageSize?: number;
  onError?: (error: unknown) => void;
}

/**
 * Delivers one conversation's stored events to one subscriber exactly once, in
 * id order, with no gap: a replay from the store, then live events.
 *
 * Live events are offered as they are published. They may arrive while the
 * replay runs, twice, or out of order (two appends committing close together);
 * the feed drops what it has sent, holds what comes early, and reads a gap
 * from the store when it does not close by itself: every published event was
 * stored first, so the store always has it.
 */
export class OrderedEventFeed {
  private lastSentId: number;
  private readonly early = new Map<number, StoredEvent>();
  /** Bytes (as JSON) of the live events held while a replay runs; 0 once they drained. */
  private held = 0;
  private started = false;
  private replaying = false;
  private gapTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly gapWaitMs: number;
  private readonly pageSize: number;

  constructor(private readonly options: OrderedEventFeedOptions) {
    this.lastSentId = options.afterId;
    this.gapWaitMs = options.gapWaitMs ?? 25;
    this.pageSize = options.pageSize ?? 1000;
  }

  get lastDeliveredId(): number {
    return this.lastSentId;
  }

  /**
   * What the feed holds for its subscriber and has not sent: live events
   * that came while a replay (waiting for a slow client) ran.
   */
  get heldBytes(): number {
    return this.held;
  }

  /** Replays everything stored after `afterId`, then delivers what arrived meanwhile. */
  async start(): Promise<void> {
    this.started = true;
    await this.catchUp(undefined);
  }

  /** Offers live events (any order, duplicates allowed). */
  offer(events: readonly StoredEvent[]): void {
    if (this.closed) return;
    const waiting = !this.started || this.replaying;
    for (const event of events) {
      if (event.id <= this.lastSentId || this.early.has(event.id)) continue;
      this.early.set(event.id, event);
      if (waiting) this.held += JSON.stringify(event).length;
    }
    // Before and during the replay, live events wait; the replay may cover them.
    if (waiting) return;
    this.drain();
    if (this.early.size > 0) this.scheduleGapFill();
  }

  /** Reads whatever was stored after the cursor (live traffic may have been lost). */
  resync(): void {
    if (!this.started || this.closed) return;
    this.catchUp(undefined).catch((error: unknown) => this.options.onError?.(error));
  }

  close(): void {
    this.closed = true;
    this.early.clear();
    this.held = 0;
    clearTimeout(this.gapTimer);
  }

  private drain(): void {
    for (;;) {
      const next = this.early.get(this.lastSentId + 1);
      if (!next) break;
      this.early.delete(next.id);
      this.deliver(next);
    }
    // Anything at or below the cursor was delivered by the replay.
    for (const id of this.early.keys()) if (id <= this.lastSentId) this.early.delete(id);
    if (this.early.size === 0) this.held = 0;
  }

  private deliver(event: StoredEvent): void {
    if (this.closed || event.id !== this.lastSentId + 1) return;
    this.lastSentId = event.id;
    this.options.send(event);
  }

  private scheduleGapFill(): void {
    if (this.gapTimer || this.closed) return;
    this.gapTimer = setTimeout(() => {
      this.gapTimer = undefined;
      if (this.early.size === 0 || this.closed) return;
      const upTo = Math.min(...this.early.keys()) - 1;
      this.catchUp(upTo).catch((error: unknown) => this.options.onError?.(error));
    }, this.gapWaitMs);
    this.gapTimer.unref?.();
  }

  /** Reads from the store after the cursor (up to `upTo`, or to the end), then drains. */
  private async catchUp(upTo: number | undefined): Promise<void> {
    if (this.replaying || this.closed) return;
    this.replaying = true;
    try {
      for (;;) {
        if (upTo !== undefined && this.lastSentId >= upTo) break;
        await this.options.beforePage?.();
        if (this.closed) return;
        const page = await this.options.read(this.lastSentId + 1, upTo, this.pageSize);
        if (this.closed) return;
        for (const event of page.events) this.deliver(event);
        if (!page.hasMore || page.events.length === 0) break;
      }
    } finally {
      this.replaying = false;
    }
    this.drain();
    if (this.early.size > 0) this.scheduleGapFill();
  }
}
