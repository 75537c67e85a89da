/**
 * A session's reads of the store: the events after the last one read, in
 * pages, into its queue (one read at a time; asked again meanwhile, it reads
 * again), and the events stored after a resumed turn's message.
 */
import type { StoredEvent } from '@cs/protocol';
import type { ConversationRef } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { UserEventQueue } from './user-event-queue.js';

export class EventReader {
  /** Events may be stored that the queue has not seen: read before acting. */
  private unread = true;
  private run: Promise<void> | null = null;
  private again = false;

  constructor(
    private readonly store: ConversationStore,
    private readonly ref: ConversationRef,
    private readonly queue: UserEventQueue,
    private readonly pageSize: number,
    /** Once the session can write no more, a read asked again is not made. */
    private readonly lifecycle: Pick<SessionLifecycle, 'isFinished'>,
  ) {}

  get isUnread(): boolean {
    return this.unread;
  }

  markUnread(): void {
    this.unread = true;
  }

  /** Reads when something may be unread. */
  catchUp(): Promise<void> {
    return this.unread ? this.sync() : Promise.resolve();
  }

  /** Reads every event after the last one read (single flight; re-runs if asked meanwhile). */
  sync(): Promise<void> {
    if (this.run) {
      this.again = true;
      return this.run;
    }
    this.run = (async () => {
      try {
        do {
          this.again = false;
          this.unread = false;
          for (;;) {
            const page = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
              fromId: this.queue.nextId,
              limit: this.pageSize,
            });
            if (!this.queue.accept(page) || page.length < this.pageSize) break;
          }
        } while (this.again && !this.lifecycle.isFinished);
      } finally {
        this.run = null;
      }
    })();
    return this.run;
  }

  /** The events stored after `id` up to the last one read (a resumed turn's progress). */
  async readAfter(id: number): Promise<StoredEvent[]> {
    const events: StoredEvent[] = [];
    for (let from = id + 1; from <= this.queue.lastEventId;) {
      const page = await this.store.readEvents(this.ref.tenantId, this.ref.conversationId, {
        fromId: from,
        toId: this.queue.lastEventId,
        limit: this.pageSize,
      });
      if (page.length === 0) break;
      // Undone events are not the turn's progress: a regenerated turn starts afresh.
      events.push(...page.filter((event) => event.undone_by === undefined));
      from = page[page.length - 1]!.id + 1;
    }
    return events;
  }
}
