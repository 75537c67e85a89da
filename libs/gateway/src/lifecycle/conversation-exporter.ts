/**
 * The export of one conversation (docs/protocol.md "Branching", `GET
 * /conversations/:id/export`): its `ConversationInfo`, every event in id
 * order, then `{ state }`, read page by page. The info and the state are
 * read together first, and the events up to the `last_event_id` they had:
 * the three agree even while the conversation goes on. A new conversation
 * created with the events as `replay_json` holds the same history: their
 * ids, causes and undone marks (see conversation-replay.ts).
 */
import {
  NotFoundError,
  toConversationInfo,
  type ConversationRecord,
  type ConversationStore,
} from '@cs/core';
import type { MultitaskStrategy } from '@cs/protocol';
import type { NdjsonSink } from './ndjson-response.js';

/** Events per read; a page is also cut at `EXPORT_PAGE_BYTES`. */
const EXPORT_PAGE_EVENTS = 500;
const EXPORT_PAGE_BYTES = 2 * 1024 * 1024;

export class ConversationExporter {
  constructor(
    private readonly store: ConversationStore,
    private readonly defaultStrategy: MultitaskStrategy,
  ) {}

  /**
   * Writes the export of the conversation; resolves with how many events it
   * wrote. `NOT_FOUND` when it is gone before the first line; one deleted
   * while its events are read ends early (`NOT_FOUND`, lines written).
   */
  async export(tenantId: string, conversationId: string, sink: NdjsonSink): Promise<number> {
    const snapshot = await this.store.getSnapshot(tenantId, conversationId);
    if (!snapshot) throw new NotFoundError();
    const { conversation, state } = snapshot;
    await sink.write([toConversationInfo(conversation, this.defaultStrategy)]);
    let fromId = 0;
    let written = 0;
    while (fromId <= conversation.lastEventId) {
      const sent = await this.sendPage(tenantId, conversationId, conversation, fromId, sink);
      written += sent.events;
      fromId = sent.nextId;
      await sent.taken;
    }
    await sink.write([{ state }]);
    return written;
  }

  /**
   * Reads the page from `fromId` and writes it to `sink`, without waiting
   * for the client: once this returns nothing refers to the page any more,
   * so that waiting for a slow client holds no page (see ndjson-response.ts).
   */
  private async sendPage(
    tenantId: string,
    conversationId: string,
    conversation: Pick<ConversationRecord, 'lastEventId' | 'incarnation'>,
    fromId: number,
    sink: NdjsonSink,
  ): Promise<{ events: number; nextId: number; taken: Promise<void> }> {
    const page = await this.store.readEventPage(tenantId, conversationId, {
      fromId,
      toId: conversation.lastEventId,
      limit: EXPORT_PAGE_EVENTS,
      maxBytes: EXPORT_PAGE_BYTES,
      incarnation: conversation.incarnation,
    });
    const last = page.events[page.events.length - 1];
    if (!last) throw new NotFoundError(); // deleted meanwhile
    return { events: page.events.length, nextId: last.id + 1, taken: sink.write(page.events) };
  }
}
