// What `LiveConversation.events()` returns: one iterator per call, fed live
// by the conversation, after the events it missed (read back through REST
// when it was opened late); each id once, in order.
import type { ConversationsApi } from './conversations-api.js';
import type { ConversationServiceError } from './errors.js';
import type { StoredEvent } from './wire.js';

/**
 * One `events()` iterator: events pushed live, after those read back through
 * REST when it was opened late; each id once, in order.
 */
export class EventQueue implements AsyncIterableIterator<StoredEvent> {
  private readonly buffered: StoredEvent[] = [];
  private lastId: number;
  private backfilling: AsyncIterator<StoredEvent> | undefined;
  private finished = false;
  private failure: ConversationServiceError | undefined;
  private wake: (() => void) | undefined;

  constructor(
    fromEventId: number,
    private readonly onClose: (queue: EventQueue) => void,
  ) {
    this.lastId = fromEventId;
  }

  backfill(source: AsyncIterable<StoredEvent>): void {
    this.backfilling = source[Symbol.asyncIterator]();
  }

  push(event: StoredEvent): void {
    this.buffered.push(event);
    this.wake?.();
  }

  end(error: ConversationServiceError | undefined): void {
    this.finished = true;
    this.failure = error;
    this.wake?.();
  }

  async next(): Promise<IteratorResult<StoredEvent>> {
    for (;;) {
      if (this.backfilling) {
        const read = await this.backfilling.next();
        if (!read.done) {
          if (read.value.id > this.lastId) return this.yield(read.value);
          continue;
        }
        this.backfilling = undefined;
      }
      const event = this.buffered.shift();
      if (event) {
        if (event.id > this.lastId) return this.yield(event);
        continue;
      }
      if (this.finished) {
        this.onClose(this);
        if (this.failure) {
          const failure = this.failure;
          this.failure = undefined;
          throw failure;
        }
        return { done: true, value: undefined };
      }
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }

  return(): Promise<IteratorResult<StoredEvent>> {
    this.finished = true;
    this.buffered.length = 0;
    this.backfilling = undefined;
    this.onClose(this);
    return Promise.resolve({ done: true, value: undefined });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<StoredEvent> {
    return this;
  }

  private yield(event: StoredEvent): IteratorResult<StoredEvent> {
    this.lastId = event.id;
    return { done: false, value: event };
  }
}

/** The stored events `fromId`..`toId` of a conversation, page by page through REST. */
export async function* readStoredEvents(
  api: ConversationsApi,
  conversationId: string,
  fromId: number,
  toId: number,
): AsyncGenerator<StoredEvent> {
  let start = fromId;
  while (start <= toId) {
    const page = await api.events(conversationId, { start_id: start, end_id: toId, limit: 100 });
    for (const event of page.events) {
      yield event;
      start = Math.max(start, event.id + 1);
    }
    if (!page.has_more || page.events.length === 0) return;
  }
}
