import { Inject, Injectable } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import { RateLimitedError } from '@cs/core';
import type { Principal } from '../auth/principal.js';
import { APP_CONFIG } from '../tokens.js';

/**
 * `MAX_CONNECTIONS_PER_USER`: the sockets and SSE streams one user holds open
 * on this process. A connection takes a place before it subscribes to
 * anything and gives it back once, however it ends.
 */
@Injectable()
export class ConnectionLimiter {
  private readonly open = new Map<string, number>();
  private readonly limit: number;

  constructor(@Inject(APP_CONFIG) config: AppConfig) {
    this.limit = config.limits.maxConnectionsPerUser;
  }

  /** Takes a place for the principal's user; returns its (idempotent) release. */
  acquire(principal: Principal): () => void {
    const key = JSON.stringify([principal.tenantId, principal.userId]);
    const count = this.open.get(key) ?? 0;
    if (count >= this.limit) {
      throw new RateLimitedError(`at most ${this.limit} connections per user`);
    }
    this.open.set(key, count + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.open.get(key) ?? 1) - 1;
      if (left > 0) this.open.set(key, left);
      else this.open.delete(key);
    };
  }

  /** Open connections of one user (tests, metrics). */
  countOf(tenantId: string, userId: string): number {
    return this.open.get(JSON.stringify([tenantId, userId])) ?? 0;
  }
}
