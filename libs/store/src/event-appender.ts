/**
 * Where an append goes: a plain one in a statement shared with the appends
 * that queue meanwhile (`AppendBatcher`), anything else, or a plain one left
 * undone, in a transaction of its own (`appendLocked`).
 */
import type { AppendOptions, AppendedEvent, EventDraft } from '@cs/core';
import { AppendBatcher, type AppendBatcherLimits } from './append-batcher.js';
import type { SqlDatabase } from './database/sql-database.js';
import { UNIQUE_VIOLATION, sqlErrorCode } from './database/sql-database.js';
import type { PreparedDraft } from './event-append.plan.js';
import { foldDeltas, planAppend, prepareDraft } from './event-append.plan.js';
import { NOTHING_STORED, appendLocked, plainAppend, type Writer } from './locked-append.js';
import { guardData } from './refused-text.js';
import {
  EventAppendRepository,
  type AppendedHead,
  type PlainAppend,
} from './repositories/event-append.repository.js';
import { toStoredEvent } from './repositories/event.repository.js';
import type { WriteClock } from './write-clock.js';

/** A few connections of the pool stay free for reads while appends queue. */
const DEFAULT_BATCHING: AppendBatcherLimits = { maxInFlight: 4, maxBatch: 100 };

export interface EventAppenderOptions {
  /** How plain appends queue and share statements. */
  batching?: AppendBatcherLimits;
  /**
   * Plain appends of several conversations share one statement (default
   * true). False writes each append in a statement that names its one
   * conversation, as on Citus, where a statement spanning conversations
   * spans shards (docs/scaling.md); appends then wait only for a connection.
   */
  crossConversationBatches?: boolean;
}

export class EventAppender {
  private readonly writeAppend: (append: PlainAppend) => Promise<AppendedHead | null>;

  constructor(
    private readonly database: SqlDatabase,
    private readonly clock: WriteClock,
    options: EventAppenderOptions = {},
  ) {
    const appends = new EventAppendRepository(database);
    if (options.crossConversationBatches === false) {
      this.writeAppend = (append) => appends.appendToLog(append, this.clock.now());
    } else {
      const batcher = new AppendBatcher(async (batch) => {
        const [only] = batch;
        const at = this.clock.now();
        if (batch.length > 1 || !only) return appends.appendToLogs(batch, at);
        const head = await appends.appendToLog(only, at);
        return new Map(head ? [[only.conversationId, head]] : []);
      }, options.batching ?? DEFAULT_BATCHING);
      this.writeAppend = (append) => batcher.append(append);
    }
  }

  /**
   * A plain append (no idempotency key seen before, no `user:` / `app:` keys)
   * is one statement, shared with the other appends of this process that
   * queue meanwhile (see `AppendBatcher` and `EventAppendRepository.appendToLogs`),
   * or its own with `crossConversationBatches: false`.
   * Anything else, or a key that turns out to be stored, takes
   * `appendInTransaction`. The conversation id is a UUID.
   */
  async append(
    tenantId: string,
    conversationId: string,
    drafts: readonly EventDraft[],
    options: AppendOptions,
  ): Promise<AppendedEvent[]> {
    const prepared = drafts.map(prepareDraft);
    const writer: Writer = {
      leaseEpoch: options.leaseEpoch ?? null,
      incarnation: options.incarnation ?? null,
      defaultMultitaskStrategy: options.defaultMultitaskStrategy ?? null,
    };
    const plan = planAppend(prepared, NOTHING_STORED, 0);
    const folded = foldDeltas(prepared);
    // Whether the agent is busy is decided under the row lock, in the transaction:
    // a message goes there when the deployment's strategy is `reject`, or when the
    // plain append finds the conversation's own strategy `reject` (left undone).
    const plain =
      writer.defaultMultitaskStrategy !== 'reject' &&
      folded.user.empty &&
      folded.app.empty &&
      folded.usage.length === 0 &&
      plan.outcomes.every((outcome) => outcome.kind === 'new' && !outcome.duplicate);
    if (!plain) return this.appendInTransaction(tenantId, conversationId, prepared, writer);

    let head: AppendedHead | null;
    try {
      head = await guardData(() =>
        this.writeAppend(plainAppend(tenantId, conversationId, plan.fresh, folded, writer)),
      );
    } catch (error) {
      // A client_event_id stored meanwhile: nothing was written; tell repeat from conflict.
      if (sqlErrorCode(error) !== UNIQUE_VIOLATION) throw error;
      head = null;
    }
    // Left undone: gone, held under a newer epoch, or a key stored before. The transaction says which.
    if (!head) return this.appendInTransaction(tenantId, conversationId, prepared, writer);
    const { firstId, at } = head;
    return plan.fresh.map((row) => ({
      event: toStoredEvent({ ...row, id: firstId + row.id, created_at: at }),
      duplicate: false,
    }));
  }

  /** `appendLocked` in a transaction of its own. */
  private appendInTransaction(
    tenantId: string,
    conversationId: string,
    prepared: readonly PreparedDraft[],
    writer: Writer,
  ): Promise<AppendedEvent[]> {
    return guardData(() =>
      this.database.transaction((tx) =>
        appendLocked(tx, tenantId, conversationId, prepared, writer, this.clock),
      ),
    );
  }
}
