/**
 * A conversation's creation on Postgres / PGlite, alone or with its first
 * events (an imported `replay_json` history, its rewinds' undone marks kept),
 * all in one transaction; a repeated create is told from a taken id.
 */
import type { ConversationRecord, EventDraft, NewConversation } from '@cs/core';
import { BadRequestError, ConflictError, undoneMarksOf } from '@cs/core';
import { rewindTarget, type StoredEvent } from '@cs/protocol';
import { isUuid } from './conversation-page.cursor.js';
import type { SqlDatabase, SqlQueryable } from './database/sql-database.js';
import type { PreparedDraft } from './event-append.plan.js';
import { prepareDraft } from './event-append.plan.js';
import { ANY_WRITER, appendLocked } from './locked-append.js';
import { guardData } from './refused-text.js';
import { BranchRepository } from './repositories/branch.repository.js';
import { ConversationRepository } from './repositories/conversation.repository.js';
import type { WriteClock } from './write-clock.js';

/** See `ConversationStore.createConversation`. */
export async function createConversation(
  database: SqlDatabase,
  clock: WriteClock,
  input: NewConversation,
  drafts: readonly EventDraft[],
): Promise<{ conversation: ConversationRecord; created: boolean }> {
  if (!isUuid(input.id)) {
    throw new BadRequestError('conversation_id must be a UUID', 'conversation_id');
  }
  const conversations = new ConversationRepository(database);
  const prepared = drafts.map(prepareDraft);
  // Two rounds: an id seen taken but then not found was either another
  // tenant's, or deleted in between; the second insert tells them apart.
  for (let round = 0; round < 2; round += 1) {
    const inserted = await guardData(() =>
      prepared.length === 0
        ? conversations.insertIfAbsent(input, clock.now())
        : insertWithEvents(database, clock, input, prepared),
    );
    if (inserted) return { conversation: inserted, created: true };
    const existing = await conversations.find(input.tenantId, input.id);
    if (existing) {
      if (existing.userId !== input.userId) break;
      return { conversation: existing, created: false };
    }
  }
  throw new ConflictError('conversation_id is already taken');
}

/**
 * The row and its first events in one transaction: all of it is stored, or
 * none. A rewind among them undoes what it undid (a replayed history).
 */
function insertWithEvents(
  database: SqlDatabase,
  clock: WriteClock,
  input: NewConversation,
  prepared: readonly PreparedDraft[],
): Promise<ConversationRecord | null> {
  return database.transaction(async (tx) => {
    const conversations = new ConversationRepository(tx);
    const inserted = await conversations.insertIfAbsent(input, clock.now());
    if (!inserted) return null;
    const appended = await appendLocked(tx, input.tenantId, input.id, prepared, ANY_WRITER, clock);
    await markReplayedRewinds(
      tx,
      input.tenantId,
      input.id,
      appended.map((outcome) => outcome.event),
    );
    return conversations.find(input.tenantId, input.id);
  });
}

/**
 * A new conversation's first events (a replayed history) that hold rewinds,
 * in the caller's transaction: each keeps its meaning, the events it undid
 * marked as `rewind` marked them. A rewind whose point is not a live event
 * before it is refused.
 */
async function markReplayedRewinds(
  tx: SqlQueryable,
  tenantId: string,
  conversationId: string,
  events: readonly StoredEvent[],
): Promise<void> {
  const rewinds = events.flatMap((event) => {
    const toEventId = rewindTarget(event);
    return toEventId === null ? [] : [{ id: event.id, toEventId }];
  });
  if (rewinds.length === 0) return;
  const { marks, invalid } = undoneMarksOf(rewinds);
  if (invalid !== null) {
    throw new BadRequestError(
      `the rewind ${invalid} goes back to no live event before it`,
      'to_event_id',
    );
  }
  if (marks.size > 0) await new BranchRepository(tx).setUndone(tenantId, conversationId, marks);
}
