import type { ConversationRecord, ConversationRef, ConversationStore } from '@cs/core';
import { isAction } from '@cs/protocol';

/**
 * Ids of the user messages after `answered_through` (the first 100 events
 * after it): the ones its session has yet to answer. What a crashed holder
 * was doing, what an error answers, whether a closed session must run again
 * and whether a stop must start the conversation again are all read from here.
 */
export async function unansweredMessages(
  store: ConversationStore,
  ref: ConversationRef,
  known: {
    /** The conversation's record, when the caller has just read it. */
    record?: ConversationRecord;
    /** Only messages after this event id. */
    afterId?: number;
  } = {},
): Promise<number[]> {
  const record = known.record ?? (await store.getConversation(ref.tenantId, ref.conversationId));
  if (!record) return [];
  const after = await store.readEvents(ref.tenantId, ref.conversationId, {
    fromId: Math.max(record.answeredThrough, known.afterId ?? -1) + 1,
    limit: 100,
  });
  return after.flatMap((event) =>
    // An undone message is answered by no one (docs/protocol.md "Branching").
    event.source === 'user' &&
    isAction(event) &&
    event.action === 'message' &&
    event.undone_by === undefined
      ? [event.id]
      : [],
  );
}

/** True when the newest user message has no settled answer after it. */
export async function hasUnansweredMessage(
  store: ConversationStore,
  ref: ConversationRef,
): Promise<boolean> {
  return (await unansweredMessages(store, ref)).length > 0;
}
