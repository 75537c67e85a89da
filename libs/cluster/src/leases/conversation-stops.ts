import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/** Long past any start's wait for a finishing run: the mark only has to outlive that. */
const STOP_MARK_TTL_MS = 3_600_000;

/**
 * How many times the conversation was stopped or evicted lately: a counter
 * that `stop` and `evict` bump before they act. A start reads it when it
 * begins; one that would start the conversation again on its own (after a
 * finishing run) does not when it moved, so that a stop or an eviction landing
 * meanwhile wins. A counter, not a time: gateways' clocks differ. It expires
 * an hour after its last bump, so that keys do not pile up.
 */
export class ConversationStops {
  constructor(
    private readonly redis: RedisConnection,
    private readonly keys: ClusterKeys,
  ) {}

  /** Records a stop (or an eviction) of the conversation. */
  async mark(conversationId: string): Promise<void> {
    const key = this.keys.conversationStops(conversationId);
    await this.redis.multi().incr(key).pexpire(key, STOP_MARK_TTL_MS).exec();
  }

  /** The conversation's mark now: a later `mark` changes it. */
  async read(conversationId: string): Promise<number> {
    return Number((await this.redis.get(this.keys.conversationStops(conversationId))) ?? 0);
  }
}
