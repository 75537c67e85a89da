/**
 * Retention (docs/protocol.md "Data lifecycle"): every `RETENTION_SWEEP_INTERVAL_MS`
 * one process of the deployment (the holder of `RETENTION_LOCK` for that
 * interval; the standalone process alone) deletes the conversations idle for
 * `RETENTION_DAYS`, as `DELETE` does: stopped first, then deleted with
 * everything they hold, their sockets and streams closed on every gateway.
 *
 * Never a long lock nor a flood: the idle search reads one small batch through
 * the activity-hour index; each conversation is deleted in its own short
 * transaction (its row and its events), four at a time, and a user who came
 * back since the search keeps it (`idleThroughEventId`); between batches the
 * sweep yields to live traffic. It works for at most a share of its interval, so that the
 * next interval's holder never overlaps it; what is left waits for that one.
 */
import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import type { DataLifecycleStore, PeriodLock } from '@cs/core';
import { ServiceMetrics } from '@cs/observability';
import { ConversationService } from '../conversations/conversation.service.js';
import { APP_CONFIG, DATA_LIFECYCLE_STORE, RETENTION_LOCK } from '../tokens.js';

const DAY_MS = 86_400_000;
/** Conversations per idle search. */
const BATCH = 50;
/**
 * Deletions at once within a batch: each waits mostly on Redis and Postgres
 * round trips (the stop's), so a few side by side sweep faster while using
 * few connections.
 */
const PARALLEL = 4;
/** The pause between batches: live traffic goes first. */
const PAUSE_MS = 20;
/** The share of its interval a sweep may work. */
const WORK_SHARE = 0.8;

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

@Injectable()
export class RetentionSweeper implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(RetentionSweeper.name);
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private sweeping: Promise<unknown> | null = null;

  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(DATA_LIFECYCLE_STORE) private readonly lifecycle: DataLifecycleStore,
    private readonly conversations: ConversationService,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    @Optional() @Inject(RETENTION_LOCK) private readonly lock: PeriodLock | null,
  ) {}

  onApplicationBootstrap(): void {
    if (this.config.lifecycle.retentionDays <= 0) return;
    const interval = this.config.lifecycle.retentionSweepIntervalMs;
    this.timer = setInterval(() => this.tick(), interval);
    this.timer.unref();
    this.tick();
  }

  async onModuleDestroy(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await this.sweeping;
  }

  private tick(): void {
    if (this.sweeping || this.stopped) return;
    this.sweeping = this.claimAndSweep()
      .catch((error: unknown) => this.logger.warn(`retention sweep failed: ${String(error)}`))
      .finally(() => {
        this.sweeping = null;
      });
  }

  private async claimAndSweep(): Promise<void> {
    const interval = this.config.lifecycle.retentionSweepIntervalMs;
    if (this.lock && !(await this.lock.claim(interval))) return;
    const deleted = await this.sweep(Date.now() + interval * WORK_SHARE);
    if (deleted > 0) this.logger.log(`retention deleted ${deleted} idle conversation(s)`);
  }

  /**
   * Deletes conversations idle since before now − `RETENTION_DAYS`, batch
   * after batch, until none is left or `deadline` (ms) passes; resolves with
   * how many it deleted.
   */
  async sweep(deadline = Number.POSITIVE_INFINITY): Promise<number> {
    const cutoff = new Date(Date.now() - this.config.lifecycle.retentionDays * DAY_MS);
    // A conversation whose delete failed is not tried again in this sweep.
    const failed = new Set<string>();
    let deleted = 0;
    while (!this.stopped && Date.now() < deadline) {
      const batch = (
        await this.lifecycle.findIdleConversations(cutoff, BATCH + failed.size)
      ).filter((idle) => !failed.has(idle.conversationId));
      if (batch.length === 0) break;
      for (let start = 0; start < batch.length && !this.stopped; start += PARALLEL) {
        const removed = await Promise.all(
          batch.slice(start, start + PARALLEL).map(async (idle) => {
            try {
              return await this.conversations.remove(idle, {
                idleThroughEventId: idle.lastEventId,
              });
            } catch (error) {
              failed.add(idle.conversationId);
              this.logger.warn({
                msg: `retention could not delete a conversation: ${String(error)}`,
                conversation_id: idle.conversationId,
                tenant_id: idle.tenantId,
              });
              return false;
            }
          }),
        );
        const count = removed.filter(Boolean).length;
        deleted += count;
        this.metrics.retentionDeleted.inc(count);
      }
      await pause(PAUSE_MS);
    }
    return deleted;
  }
}
