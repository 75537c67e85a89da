/**
 * Fork and rewind on Postgres / PGlite (docs/protocol.md "Branching"), each one
 * transaction: what they decide is here, the SQL in `BranchRepository`.
 */
import type { AppendedEvent, ConversationRecord, ForkRequest, RewindRequest } from '@cs/core';
import {
  BadRequestError,
  ConflictError,
  NotFoundError,
  forkAgentState,
  rewindDraft,
  stateDeltaBetween,
  unfinishedCallResult,
} from '@cs/core';
import { rewindTarget } from '@cs/protocol';
import type { SqlQueryable } from './database/sql-database.js';
import { prepareDraft } from './event-append.plan.js';
import { ANY_WRITER, appendLocked } from './locked-append.js';
import { BranchRepository } from './repositories/branch.repository.js';
import { ConversationRepository } from './repositories/conversation.repository.js';
import { EventRepository } from './repositories/event.repository.js';
import type { WriteClock } from './write-clock.js';

/** The largest id a point may name (it is checked against the log under the lock). */
function assertPoint(value: number, field: string, lastEventId: number, lowest = 0): void {
  if (!Number.isSafeInteger(value) || value < lowest) {
    throw new BadRequestError(`${field} must be an event id`, field);
  }
  if (value > lastEventId) {
    throw new BadRequestError(`${field} is after the conversation's last event`, field);
  }
}

/**
 * A fork, in the caller's transaction: the source is locked for share (its
 * appends wait a moment; reads and other forks do not), the fork's row is
 * made from it, its events copied in one statement, and calls without a
 * result answered.
 */
export async function forkLocked(
  tx: SqlQueryable,
  tenantId: string,
  sourceId: string,
  request: ForkRequest,
  clock: WriteClock,
): Promise<{ conversation: ConversationRecord; created: boolean }> {
  const branches = new BranchRepository(tx);
  const conversations = new ConversationRepository(tx);
  const source = await branches.lock(tenantId, sourceId, 'share');
  if (!source) throw new NotFoundError();
  const atEventId = request.atEventId ?? source.lastEventId;
  if (request.atEventId !== undefined) {
    assertPoint(request.atEventId, 'at_event_id', source.lastEventId);
  }
  // One statement at a time: a transaction is one connection (and PGlite one session).
  const state = await branches.stateAt(tenantId, sourceId, atEventId);
  const agentState = await branches.agentStateAt(tenantId, sourceId, atEventId);
  const inserted = await branches.insertFork({
    tenantId,
    sourceId,
    id: request.conversationId,
    userId: request.userId,
    title: request.title ?? null,
    metadata: request.metadata === undefined ? null : JSON.stringify(request.metadata),
    atEventId,
    state: JSON.stringify(state),
    agentState: forkAgentState(agentState),
    at: clock.now(),
  });
  if (!inserted) {
    const existing = await conversations.find(tenantId, request.conversationId);
    if (
      existing &&
      existing.userId === request.userId &&
      existing.forkedFrom?.conversationId === sourceId
    ) {
      return { conversation: existing, created: false };
    }
    throw new ConflictError('conversation_id is already taken');
  }
  if (atEventId >= 0) {
    await branches.copyEvents(tenantId, sourceId, request.conversationId, atEventId);
    const open = await branches.callsWithoutResult(
      tenantId,
      request.conversationId,
      atEventId,
      atEventId,
    );
    if (open.length > 0) {
      await appendLocked(
        tx,
        tenantId,
        request.conversationId,
        open.map((call) => prepareDraft(unfinishedCallResult(call, 'forked'))),
        ANY_WRITER,
        clock,
      );
    }
  }
  const conversation = await conversations.find(tenantId, request.conversationId);
  if (!conversation) throw new Error('a fork vanished in its own transaction');
  return { conversation, created: true };
}

/** A rewind, in the caller's transaction (see `ConversationStore.rewind`). */
export async function rewindLocked(
  tx: SqlQueryable,
  tenantId: string,
  conversationId: string,
  request: RewindRequest,
  clock: WriteClock,
): Promise<AppendedEvent> {
  const branches = new BranchRepository(tx);
  const head = await branches.lock(tenantId, conversationId, 'update');
  if (!head || (request.incarnation !== undefined && request.incarnation !== head.incarnation)) {
    throw new NotFoundError();
  }
  if (request.clientEventId !== undefined) {
    const stored = await new EventRepository(tx).findByClientEventIds(tenantId, conversationId, [
      request.clientEventId,
    ]);
    const first = stored.get(request.clientEventId);
    if (first) {
      if (rewindTarget(first.event) !== request.toEventId) {
        throw new ConflictError(
          `client_event_id ${request.clientEventId} was already used for another event`,
        );
      }
      return { event: first.event, duplicate: true };
    }
  }
  const { toEventId } = request;
  // -1: before the first event (an edit of the first message undoes everything).
  assertPoint(toEventId, 'to_event_id', head.lastEventId, -1);
  if (toEventId >= 0 && (await branches.undoneBy(tenantId, conversationId, toEventId)) !== null) {
    throw new BadRequestError('to_event_id is an undone event', 'to_event_id');
  }
  const target = await branches.stateAt(tenantId, conversationId, toEventId);
  const open = await branches.callsWithoutResult(
    tenantId,
    conversationId,
    toEventId,
    Number.MAX_SAFE_INTEGER,
  );
  const drafts = [
    rewindDraft(toEventId, stateDeltaBetween(head.state, target), request.clientEventId),
    ...open.map((call) => unfinishedCallResult(call, 'rewound')),
  ];
  const appended = await appendLocked(
    tx,
    tenantId,
    conversationId,
    drafts.map(prepareDraft),
    ANY_WRITER,
    clock,
  );
  const rewind = appended[0];
  const last = appended[appended.length - 1];
  if (!rewind || !last) throw new Error('the store appended nothing');
  await branches.markUndone(tenantId, conversationId, toEventId, rewind.event.id);
  await branches.settleRewind(
    tenantId,
    conversationId,
    JSON.stringify(target),
    request.answerAgain ? toEventId - 1 : last.event.id,
    request.answerAgain ?? false,
  );
  return rewind;
}
