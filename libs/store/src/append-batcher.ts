/**
 * Group commit for plain appends. Appends that arrive while earlier ones are
 * in flight wait, and go together in one statement (one round trip, one
 * commit, one WAL flush), at most one per conversation in each. Alone, an
 * append goes at once: batching costs no latency, it only takes up what
 * queues under load.
 */
import type { AppendedHead, PlainAppend } from './repositories/event-append.repository.js';

export interface AppendBatcherLimits {
  /** Statements in flight at once (each holds a database connection). */
  maxInFlight: number;
  /** Appends in one statement. */
  maxBatch: number;
}

interface Waiting {
  append: PlainAppend;
  resolve: (head: AppendedHead | null) => void;
  reject: (error: unknown) => void;
}

/** Writes a batch; appends left undone are missing from the result. */
export type WriteBatch = (appends: readonly PlainAppend[]) => Promise<Map<string, AppendedHead>>;

export class AppendBatcher {
  private queue: Waiting[] = [];
  private inFlight = 0;

  constructor(
    private readonly write: WriteBatch,
    private readonly limits: AppendBatcherLimits,
  ) {}

  /** Where the events went, or null when the append was left undone (see `WriteBatch`). */
  append(append: PlainAppend): Promise<AppendedHead | null> {
    return new Promise((resolve, reject) => {
      this.queue.push({ append, resolve, reject });
      this.pump();
    });
  }

  private pump(): void {
    while (this.inFlight < this.limits.maxInFlight && this.queue.length > 0) {
      const batch = this.takeBatch();
      this.inFlight += 1;
      void this.flush(batch).finally(() => {
        this.inFlight -= 1;
        this.pump();
      });
    }
  }

  /** The oldest waiting appends, one per conversation; the rest keep their places. */
  private takeBatch(): Waiting[] {
    const batch: Waiting[] = [];
    const rest: Waiting[] = [];
    const conversations = new Set<string>();
    for (const waiting of this.queue) {
      const id = waiting.append.conversationId;
      if (batch.length < this.limits.maxBatch && !conversations.has(id)) {
        conversations.add(id);
        batch.push(waiting);
      } else {
        rest.push(waiting);
      }
    }
    this.queue = rest;
    return batch;
  }

  private async flush(batch: readonly Waiting[]): Promise<void> {
    try {
      const heads = await this.write(batch.map((waiting) => waiting.append));
      for (const waiting of batch)
        waiting.resolve(heads.get(waiting.append.conversationId) ?? null);
    } catch (error) {
      if (batch.length === 1) {
        batch[0]!.reject(error);
        return;
      }
      // One append's fault (a key stored meanwhile, text Postgres refuses) fails
      // the whole statement: each goes again alone, to fail only its own caller.
      await Promise.all(batch.map((waiting) => this.flush([waiting])));
    }
  }
}
