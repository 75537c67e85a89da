/**
 * Waiting for a turn over REST (docs/protocol.md "Waiting for an answer over
 * REST"): a waiter is one more subscriber of the conversation's room, fed by
 * the same gap-free replay-then-live feed as a socket, so that a gateway of a
 * cluster learns of the turn's end from the conversation's live channel, not
 * by polling Postgres. It joins the room before the message is stored (the
 * subscription overlaps the append), replays what was stored after the
 * message once both are done, and then only listens. A client that leaves,
 * the time running out or the process draining ends it: it leaves the room
 * and clears its timer, and nothing of it remains.
 */
import { Inject, Injectable } from '@nestjs/common';
import { ServiceMetrics } from '@cs/observability';
import { NotFoundError, TurnTracker, refOf, roomKey, type ConversationRecord } from '@cs/core';
import { StatusId, type StatusUpdate, type StoredEvent } from '@cs/protocol';
import { ConversationService } from '../conversations/conversation.service.js';
import { ConversationRoomHub, type ConversationSubscriber } from './conversation-room-hub.js';
import { OrderedEventFeed } from './ordered-event-feed.js';

/** Events read per store page while a turn's events are read back. */
const TURN_PAGE_SIZE = 100;

@Injectable()
export class TurnWatchService {
  private readonly watches = new Set<TurnWatch>();

  constructor(
    private readonly conversations: ConversationService,
    private readonly hub: ConversationRoomHub,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
  ) {}

  /** Joins the conversation's room now; `until` then waits for one turn. */
  watch(conversation: ConversationRecord): TurnWatch {
    const watch = new TurnWatch(this.hub, conversation, this.conversations, () => {
      this.watches.delete(watch);
      this.metrics.restTurnWaits.dec();
    });
    this.watches.add(watch);
    this.metrics.restTurnWaits.inc();
    return watch;
  }

  /** The turn of user event `eventId` as stored now (`GET …/turns/:event_id`). */
  async read(conversation: ConversationRecord, eventId: number): Promise<TurnTracker> {
    const first = await this.conversations.readPage(conversation, eventId, eventId, 1);
    if (first.events[0]?.source !== 'user') throw new NotFoundError('event not found');
    const tracker = new TurnTracker(eventId);
    let fromId = eventId + 1;
    for (;;) {
      const page = await this.conversations.readPage(
        conversation,
        fromId,
        undefined,
        TURN_PAGE_SIZE,
      );
      for (const event of page.events) tracker.add(event);
      const last = page.events.at(-1);
      if (tracker.ended || !page.hasMore || last === undefined) return tracker;
      fromId = last.id + 1;
    }
  }

  /** Draining: every waiter answers now with what it has (`turn: null`). */
  endAll(): void {
    for (const watch of [...this.watches]) watch.dispose();
  }
}

/** One waiting request's place in a conversation's room. */
export class TurnWatch implements ConversationSubscriber {
  private readonly leave: () => void;
  private readonly ready: Promise<void>;
  private feed: OrderedEventFeed | null = null;
  private tracker: TurnTracker | null = null;
  private timer: NodeJS.Timeout | undefined;
  private finish: ((tracker: TurnTracker | null) => void) | null = null;
  private disposed = false;

  constructor(
    hub: ConversationRoomHub,
    private readonly conversation: ConversationRecord,
    private readonly conversations: ConversationService,
    private readonly onDispose: () => void,
  ) {
    const membership = hub.join(roomKey(refOf(conversation)), this);
    this.leave = membership.leave;
    this.ready = membership.ready;
    this.ready.catch(() => undefined); // awaited in `until`
  }

  /**
   * Resolves with the turn of user event `eventId` once it has ended or
   * awaits confirmation; with null when `timeoutMs` passed first, or the
   * watch was disposed (the client left, the process drains).
   */
  async until(eventId: number, timeoutMs: number): Promise<TurnTracker | null> {
    if (this.disposed) return null;
    const tracker = new TurnTracker(eventId);
    this.tracker = tracker;
    const answer = new Promise<TurnTracker | null>((resolve) => {
      this.finish = resolve;
    });
    this.timer = setTimeout(() => this.dispose(), timeoutMs);
    this.timer.unref();
    try {
      await this.ready;
    } catch {
      // No live traffic (a Redis outage): answer as a time-out would.
      this.dispose();
      return answer;
    }
    if (this.disposed) return answer;
    const feed = new OrderedEventFeed({
      afterId: eventId,
      read: (fromId, toId, limit) =>
        this.conversations.readPage(this.conversation, fromId, toId, limit),
      send: (event) => this.take(event),
      onError: () => undefined, // the next live event or the time-out ends the wait
    });
    this.feed = feed;
    feed.start().catch(() => undefined);
    return answer;
  }

  /** Ends the wait (idempotent): leaves the room, clears the timer, answers null. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    clearTimeout(this.timer);
    this.feed?.close();
    this.leave();
    this.onDispose();
    this.finish?.(null);
    this.finish = null;
  }

  private take(event: StoredEvent): void {
    const tracker = this.tracker;
    if (!tracker || this.disposed) return;
    tracker.add(event);
    if (!tracker.answered) return;
    const finish = this.finish;
    this.finish = null;
    finish?.(tracker);
    this.dispose();
  }

  // ------------------------------------------------- ConversationSubscriber

  offerEvents(events: readonly StoredEvent[]): void {
    this.feed?.offer(events);
  }

  sendStatus(status: StatusUpdate): void {
    if (status.id === StatusId.ConversationDeleted) this.dispose();
  }

  sendStream(): void {
    // Deltas are not part of a turn's answer: its stored message is.
  }

  resync(): void {
    this.feed?.resync();
  }
}
