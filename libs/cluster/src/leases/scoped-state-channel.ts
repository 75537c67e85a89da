import type { ScopedStateChange } from '@cs/core';
import { ScopedStateChangeSchema } from '@cs/protocol';
import type { RedisConnection } from '../redis/redis-connections.js';
import type { ClusterKeys } from '../redis/cluster-keys.js';

/**
 * The deployment's one Redis channel (sharded, under its own `{state}` tag) of scoped-state changes: the worker
 * whose session stored `app:` or `user:` keys publishes the change, and every
 * worker (itself too) hands it to the sessions it hosts, which read those
 * keys again before their next step. Best effort, like the rest of the live
 * traffic: a change lost on its way (Redis away, a subscriber reconnecting)
 * leaves a running conversation with the old values until a later change
 * reaches it or it starts again, when it reads them all.
 */
export class ScopedStateChannel {
  private handler: ((change: ScopedStateChange) => void) | null = null;

  /**
   * @param publisher a regular connection
   * @param subscriber a connection used only for subscriptions (may be shared with the inbox)
   */
  constructor(
    private readonly publisher: RedisConnection,
    private readonly subscriber: RedisConnection,
    private readonly keys: ClusterKeys,
  ) {
    subscriber.on('smessage', (channel: string, raw: string) => {
      if (channel !== keys.scopedStateChanges || !this.handler) return;
      const parsed = ScopedStateChangeSchema.safeParse(parseJson(raw));
      // Typed as core's own: the compiler keeps the schema and the type alike.
      const change: ScopedStateChange | undefined = parsed.data;
      if (change) this.handler(change);
    });
  }

  /** Sends the change to every worker; never rejects (a change may be lost). */
  publish(change: ScopedStateChange): void {
    this.publisher
      .spublish(this.keys.scopedStateChanges, JSON.stringify(change))
      .catch(() => undefined);
  }

  async listen(handler: (change: ScopedStateChange) => void): Promise<void> {
    this.handler = handler;
    await this.subscriber.ssubscribe(this.keys.scopedStateChanges);
  }

  async unlisten(): Promise<void> {
    if (!this.handler) return;
    this.handler = null;
    await this.subscriber.sunsubscribe(this.keys.scopedStateChanges);
  }
}

function parseJson(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    return undefined; // not ours: the schema refuses it
  }
}
