/**
 * Runs the stored erasure jobs (table `erasures`): any gateway, or the
 * standalone process, takes a running erasure whose lease is free or past its
 * time, runs its steps under the lease (renewed as it goes), and marks it
 * done. The process that accepted the request stores it leased to itself and
 * starts it at once; one that
 * died midway (kill -9) leaves its lease to expire, and the next look of any
 * process, every `ERASURE_POLL_MS`, resumes it from the first step (each is
 * idempotent), as it does one that failed (Postgres away). One that
 * drains hands its lease back at once.
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import type { DataLifecycleStore, ErasureRecord, UserKeyEraser } from '@cs/core';
import { ConversationService } from '../conversations/conversation.service.js';
import { ConversationSockets } from '../realtime/conversation-sockets.js';
import { DATA_LIFECYCLE_STORE, USER_KEY_ERASER } from '../tokens.js';
import { erasureSteps, type ErasureJob, type ErasureStep } from './erasure-steps.js';

/** A runner that stops renewing loses its erasure this long after. */
export const ERASURE_LEASE_MS = 10_000;
/** Renewed at most this often (one UPDATE). */
const RENEW_EVERY_MS = 2_000;
/** How often each process looks for an erasure nobody runs. */
export const ERASURE_POLL_MS = 2_000;
/** A user who keeps creating conversations while erased: the rounds before giving way. */
const MAX_ROUNDS = 20;

class ErasureLeaseLost extends Error {
  constructor() {
    super('another runner took the erasure over');
  }
}

@Injectable()
export class ErasureRunner implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(ErasureRunner.name);
  private readonly owner = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  private readonly steps: ErasureStep[];
  private timer: NodeJS.Timeout | undefined;
  private polling = false;
  private stopped = false;
  /** Erasures this process runs now, and the runs' ends. */
  private readonly running = new Map<string, Promise<void>>();

  constructor(
    @Inject(DATA_LIFECYCLE_STORE) private readonly lifecycle: DataLifecycleStore,
    conversations: ConversationService,
    sockets: ConversationSockets,
    @Optional() @Inject(USER_KEY_ERASER) keys: UserKeyEraser | null,
  ) {
    this.steps = erasureSteps({ conversations, lifecycle, sockets, keys: keys ?? null });
  }

  onApplicationBootstrap(): void {
    this.timer = setInterval(() => void this.poll(), ERASURE_POLL_MS);
    this.timer.unref();
    void this.poll();
  }

  async onModuleDestroy(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    await Promise.allSettled(this.running.values());
  }

  /** The lease a new erasure is stored with: this process runs it (`adopt`). */
  newLease(): { owner: string; until: Date } {
    return { owner: this.owner, until: new Date(Date.now() + ERASURE_LEASE_MS) };
  }

  /** Runs an erasure this process stored with `newLease`, now. */
  adopt(erasure: ErasureRecord): void {
    const run = this.run(erasure).finally(() => this.running.delete(erasure.id));
    this.running.set(erasure.id, run);
  }

  private async poll(): Promise<void> {
    if (this.polling || this.stopped) return;
    this.polling = true;
    try {
      while (!this.stopped && (await this.claimAndRun())) {
        // one more: several may wait
      }
    } finally {
      this.polling = false;
    }
  }

  /** Claims one free erasure and runs it; false when none was free. */
  private async claimAndRun(): Promise<boolean> {
    let erasure: ErasureRecord | null;
    try {
      const now = new Date();
      erasure = await this.lifecycle.claimErasure(
        this.owner,
        now,
        new Date(now.getTime() + ERASURE_LEASE_MS),
      );
    } catch (error) {
      this.logger.warn(`could not look for erasures: ${String(error)}`);
      return false;
    }
    if (!erasure) return false;
    const run = this.run(erasure).finally(() => this.running.delete(erasure.id));
    this.running.set(erasure.id, run);
    await run;
    return true;
  }

  private async run(erasure: ErasureRecord): Promise<void> {
    const { id, tenantId, userId } = erasure;
    if (userId === null) return;
    const fields = { erasure_id: id, tenant_id: tenantId };
    let renewedAt = Date.now();
    const job: ErasureJob = {
      erasureId: id,
      tenantId,
      userId,
      renew: async () => {
        if (this.stopped) throw new ErasureLeaseLost();
        if (Date.now() - renewedAt < RENEW_EVERY_MS) return;
        renewedAt = Date.now();
        const until = new Date(renewedAt + ERASURE_LEASE_MS);
        if (!(await this.lifecycle.renewErasure(id, this.owner, until))) {
          throw new ErasureLeaseLost();
        }
      },
    };
    try {
      for (let round = 0; round < MAX_ROUNDS; round += 1) {
        for (const step of this.steps) await step.run(job);
        if (await this.lifecycle.finishErasure(id, this.owner, new Date())) {
          this.logger.log({ msg: 'erasure done', ...fields });
          return;
        }
        // A conversation created meanwhile: once more (or the lease went: renew says).
        renewedAt = 0;
        await job.renew();
      }
      // Tried again once the lease runs out, here or elsewhere.
      this.logger.warn({ msg: 'erasure not done yet: conversations keep coming', ...fields });
    } catch (error) {
      // Draining: another process resumes it at once. A failure: once the lease runs out.
      if (this.stopped) await this.handBack(id);
      else if (!(error instanceof ErasureLeaseLost)) {
        this.logger.warn({ msg: `erasure interrupted: ${String(error)}`, ...fields });
      }
    }
  }

  /** Frees the lease at once: the next look of any process resumes the erasure. */
  private async handBack(id: string): Promise<void> {
    await this.lifecycle.renewErasure(id, this.owner, new Date(0)).catch(() => false);
  }
}
