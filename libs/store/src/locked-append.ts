/**
 * The append that takes a transaction (an idempotency key seen before,
 * `user:` / `app:` keys, model usage to record, a refusal when busy, or a
 * plain append left undone), and what every append is written as: the plain append of
 * `EventAppendRepository.appendToLog(s)`.
 */
import type { AppendedEvent } from '@cs/core';
import {
  AgentBusyError,
  LeaseLostError,
  NotFoundError,
  effectiveMultitaskStrategy,
  isAgentBusy,
} from '@cs/core';
import type { MultitaskStrategy, StoredEvent } from '@cs/protocol';
import type { SqlQueryable } from './database/sql-database.js';
import type { AppendPlan, FoldedDeltas, PreparedDraft } from './event-append.plan.js';
import { eventRowsJson, foldDeltas, planAppend } from './event-append.plan.js';
import { ConversationRepository } from './repositories/conversation.repository.js';
import { EventAppendRepository, type PlainAppend } from './repositories/event-append.repository.js';
import type { StoredEventRow } from './repositories/event.repository.js';
import { EventRepository, toStoredEvent } from './repositories/event.repository.js';
import { ScopedStateRepository } from './repositories/scoped-state.repository.js';
import { UsageRepository } from './repositories/usage.repository.js';
import type { WriteClock } from './write-clock.js';

export const NOTHING_STORED: ReadonlyMap<string, StoredEventRow> = new Map();

/** A plain append of planned events (ids as offsets) with their folded deltas. */
export function plainAppend(
  tenantId: string,
  conversationId: string,
  fresh: AppendPlan['fresh'],
  folded: FoldedDeltas,
  writer: Writer,
): PlainAppend {
  return {
    tenantId,
    conversationId,
    rowsJson: eventRowsJson(fresh),
    count: fresh.length,
    clientEventIds: fresh.flatMap((row) => row.client_event_id ?? []),
    leaseEpoch: writer.leaseEpoch,
    incarnation: writer.incarnation,
    agentState: folded.agentState,
    answeredThrough: folded.answeredThrough,
    stateSet: folded.conversation.set,
    stateDeleted: folded.conversation.deleted,
    metrics: folded.metrics,
    turnCost: folded.turnCost,
    undoneUnderReject: writer.defaultMultitaskStrategy !== null,
  };
}

/** Who writes an append: its lease epoch and the incarnation it knows (null: none). */
export interface Writer {
  leaseEpoch: number | null;
  incarnation: string | null;
  /** `AppendOptions.defaultMultitaskStrategy` (null: not a user message that may be refused). */
  defaultMultitaskStrategy: MultitaskStrategy | null;
}

export const ANY_WRITER: Writer = {
  leaseEpoch: null,
  incarnation: null,
  defaultMultitaskStrategy: null,
};

/**
 * An append in a transaction the caller holds: lock the row, check the
 * lease, tell repeats from new events, then write the conversation row, the
 * events and the scoped states. Rows are always locked in the order
 * conversation, user state, app state, so appends cannot deadlock.
 */
export async function appendLocked(
  tx: SqlQueryable,
  tenantId: string,
  conversationId: string,
  prepared: readonly PreparedDraft[],
  writer: Writer,
  clock: WriteClock,
): Promise<AppendedEvent[]> {
  const clientEventIds = [...new Set(prepared.flatMap((draft) => draft.clientEventId ?? []))];
  const conversations = new ConversationRepository(tx);
  const events = new EventRepository(tx);

  const head = await conversations.lockForAppend(tenantId, conversationId);
  // Another conversation under the same id is not the one the writer knows.
  if (!head || (writer.incarnation !== null && writer.incarnation !== head.incarnation)) {
    throw new NotFoundError();
  }
  if (writer.leaseEpoch !== null && writer.leaseEpoch !== head.leaseEpoch) {
    throw new LeaseLostError(conversationId, writer.leaseEpoch, head.leaseEpoch);
  }
  // Read under the lock: a concurrent append of the same key has committed by now.
  const stored =
    clientEventIds.length === 0
      ? NOTHING_STORED
      : await events.findByClientEventIds(tenantId, conversationId, clientEventIds);
  // Ids are offsets here: the one-row statement assigns them from last_event_id.
  const plan = planAppend(prepared, stored, 0);
  if (plan.fresh.length === 0) {
    return plan.outcomes.map((outcome) => {
      if (outcome.kind !== 'stored') throw new Error('a new event without a row');
      return { event: outcome.event, duplicate: true };
    });
  }

  // The strategy as it is now, under the lock: a PATCH applies from the next message on.
  const busy =
    writer.defaultMultitaskStrategy !== null &&
    effectiveMultitaskStrategy(head, writer.defaultMultitaskStrategy) === 'reject' &&
    (await isAgentBusy({
      agentState: head.agentState,
      unansweredMessages: () =>
        events.countUserMessagesAfter(conversationId, head.answeredThrough, 2),
    }));
  if (busy) throw new AgentBusyError();
  const folded = foldDeltas(plan.fresh.map((row) => row.prepared));
  const at = clock.now();
  // Decided: the statement must not leave it undone again for the strategy.
  const appended = await new EventAppendRepository(tx).appendToLog(
    plainAppend(tenantId, conversationId, plan.fresh, folded, {
      ...writer,
      defaultMultitaskStrategy: null,
    }),
    at,
  );
  // The row is locked by this transaction, its lease checked: it cannot have gone.
  if (!appended) throw new Error(`conversation ${conversationId} vanished during an append`);
  const states = new ScopedStateRepository(tx);
  if (!folded.user.empty) {
    await states.mergeUserState(
      tenantId,
      head.appName,
      head.userId,
      folded.user.set,
      folded.user.deleted,
      at,
    );
  }
  if (!folded.app.empty) {
    await states.mergeAppState(tenantId, head.appName, folded.app.set, folded.app.deleted, at);
  }

  if (folded.usage.length > 0) {
    const usage = new UsageRepository(tx);
    // The UTC day of the write: the day the step's events carry.
    const day = at.slice(0, 10);
    for (const delta of folded.usage) {
      await usage.add(tenantId, head.userId, conversationId, day, delta);
    }
  }

  const written: StoredEvent[] = plan.fresh.map((row) =>
    toStoredEvent({ ...row, id: appended.firstId + row.id, created_at: appended.at }),
  );
  return plan.outcomes.map((outcome): AppendedEvent => {
    if (outcome.kind === 'stored') return { event: outcome.event, duplicate: true };
    return { event: written[outcome.index]!, duplicate: outcome.duplicate };
  });
}
