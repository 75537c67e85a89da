import { randomUUID } from 'node:crypto';
import type { ConversationRef, ConversationStore } from '@cs/core';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';
import { runScript } from '../redis/lua-scripts.js';
import { unansweredMessages } from './unanswered-messages.js';

/** The `extras.reason` of a conversation ended by the breaker. */
export const TOO_MANY_FAILOVERS = 'too_many_failovers';

export interface FailoverBreakerOptions {
  /** More failovers than this within `windowMs`, on the same work, trip the breaker. */
  maxFailovers: number;
  windowMs: number;
}

/**
 * The circuit breaker against a conversation that crashes its workers (a
 * message its agent dies on, a history too big to load): more than
 * `maxFailovers` crashed holders within `failoverWindowMs` while doing the
 * same thing end it in `error`. What a holder was doing is read from
 * Postgres: answering the oldest unanswered message, or loading. A holder
 * that died while the conversation sat idle, or on a message that the next
 * holder answered, says nothing about the conversation: workers killed or
 * paused for other reasons do not add up against it.
 *
 * The crashes live in a sorted set per conversation
 * (`record-failover-1.lua`: forget the old ones, add this one, count those
 * on the same work, in one step).
 */
export class FailoverBreaker {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
    private readonly store: ConversationStore,
    private readonly options: FailoverBreakerOptions,
  ) {}

  /**
   * Counts the crash of the conversation's previous holder against what it
   * was doing; true when that trips the breaker.
   */
  async tripsOnCrash(ref: ConversationRef): Promise<boolean> {
    const work = await this.workAtCrash(ref);
    if (work === null) return false;
    const crashes = (await runScript(
      this.redis,
      'record-failover-1',
      [this.keys.conversationFailovers(ref.conversationId)],
      [this.options.windowMs, work, randomUUID()],
    )) as number;
    return crashes > this.options.maxFailovers;
  }

  /** `message:<id>` (the oldest unanswered user message), `loading`, or null (idle). */
  private async workAtCrash(ref: ConversationRef): Promise<string | null> {
    const pending = await unansweredMessages(this.store, ref);
    if (pending.length > 0) return `message:${Math.min(...pending)}`;
    const record = await this.store.getConversation(ref.tenantId, ref.conversationId);
    return record?.agentState === 'loading' ? 'loading' : null;
  }
}
