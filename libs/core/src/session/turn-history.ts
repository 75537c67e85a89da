/**
 * What a turn's agent sees of the conversation (`context.history`), read
 * from the store as asked: events up to the turn's trigger, what earlier
 * turns stored after it (an answer, a tool call with its result), and what
 * this turn stored; never a user message queued behind the trigger, nor
 * anything caused by one. A small
 * bounded cache of recent events spares the store the re-reads of a turn's
 * steps; the session never holds a whole history.
 */
import type { StoredEvent } from '@cs/protocol';
import type { ConversationHistory } from '../agent.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import type { ConversationRef } from '../conversation.js';

const PAGE = 100;

/** The last events a session read or wrote, by id: at most `capacity`. */
export class RecentEvents {
  private readonly byId = new Map<number, StoredEvent>();

  constructor(private readonly capacity = 32) {}

  put(event: StoredEvent): void {
    this.byId.delete(event.id);
    this.byId.set(event.id, event);
    while (this.byId.size > this.capacity) {
      const oldest = this.byId.keys().next().value as number;
      this.byId.delete(oldest);
    }
  }

  get(id: number): StoredEvent | undefined {
    return this.byId.get(id);
  }
}

export class TurnHistory implements ConversationHistory {
  constructor(
    private readonly store: ConversationStore,
    private readonly ref: ConversationRef,
    private readonly trigger: StoredEvent,
    /** Ids of the events this turn stored (tool calls, results, messages). */
    private readonly turnEvents: ReadonlySet<number>,
    readonly last_event_id: number,
    private readonly cache: RecentEvents,
  ) {}

  /**
   * Whether the turn's agent may see each event stored after the trigger, by
   * id: what the turn stored, and what an earlier turn stored late (its
   * answer, a tool call and that call's result), followed through `cause`.
   */
  private readonly visibleAfterTrigger = new Map<number, boolean>();

  /** True when the turn's agent may see `event`. */
  private async sees(event: StoredEvent): Promise<boolean> {
    // Undone by a rewind: no agent sees it again (docs/protocol.md "Branching").
    if (event.undone_by !== undefined) return false;
    if (event.id <= this.trigger.id) return true;
    if (event.source === 'user') return false;
    if (this.turnEvents.has(event.id)) return true;
    const cause = event.cause ?? -1;
    if (cause <= this.trigger.id || this.turnEvents.has(cause)) return true;
    // Caused by an event after the trigger: seen when that one is (a result of
    // an earlier turn's call stored late), never when it leads to a queued message.
    let visible = this.visibleAfterTrigger.get(cause);
    if (visible === undefined) {
      const [causeEvent] = await this.read(cause, cause);
      visible = causeEvent !== undefined && (await this.sees(causeEvent));
      this.visibleAfterTrigger.set(cause, visible);
    }
    return visible;
  }

  async recent(limit: number): Promise<StoredEvent[]> {
    const wanted = Math.max(0, Math.floor(limit));
    const found: StoredEvent[] = [];
    let upTo = this.last_event_id;
    while (found.length < wanted && upTo >= 0) {
      const page = await this.read(Math.max(0, upTo - PAGE + 1), upTo);
      for (let i = page.length - 1; i >= 0 && found.length < wanted; i -= 1) {
        const event = page[i]!;
        if (await this.sees(event)) found.push(event);
      }
      upTo -= PAGE;
    }
    return found.reverse();
  }

  async *range(start_id: number, end_id: number): AsyncIterable<StoredEvent> {
    const end = Math.min(end_id, this.last_event_id);
    for (let from = Math.max(0, start_id); from <= end; from += PAGE) {
      const page = await this.read(from, Math.min(end, from + PAGE - 1));
      for (const event of page) if (await this.sees(event)) yield event;
    }
  }

  /** Events `from`…`to`, from the cache when it has them all. */
  private async read(from: number, to: number): Promise<StoredEvent[]> {
    const cached: StoredEvent[] = [];
    for (let id = from; id <= to; id += 1) {
      const event = this.cache.get(id);
      if (!event) break;
      cached.push(event);
    }
    if (cached.length === to - from + 1) return cached;
    const events = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
      fromId: from,
      toId: to,
      limit: to - from + 1,
    });
    for (const event of events) this.cache.put(event);
    return events;
  }
}
