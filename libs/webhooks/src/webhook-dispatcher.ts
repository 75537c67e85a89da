/**
 * Sends the outbox's deliveries (docs/protocol.md "Webhooks"): claims the heads
 * of the (conversation, endpoint) queues that are due, posts each once,
 * records the outcome, and goes on. Runs in every worker of a cluster and in
 * the standalone process; several dispatchers share the work through the
 * outbox's claims (Postgres row locks, `SKIP LOCKED`), so that nothing else
 * coordinates them and a Redis restart loses nothing. A dispatcher killed
 * mid-attempt leaves a claim that lapses after `timeoutMs` + a margin; the
 * delivery is then sent again, with the same webhook-id and body (at least
 * once), and the deliveries behind it waited meanwhile (order kept).
 *
 * `wake()` says that deliveries may have been written; without it the
 * dispatcher still looks every `pollIntervalMs` (retries come due so, and
 * writes of other processes are found so when no hint reaches this one).
 */
import type { ClaimedWebhookDelivery, WebhookOutbox } from '@cs/core';
import { retryDelayMs } from './webhook-backoff.js';
import { postWebhook, type WebhookAttemptResult } from './webhook-request.js';

export type WebhookOutcome = 'delivered' | 'retried' | 'failed';

export interface WebhookEndpointSecret {
  url: string;
  /** `whsec_…`: kept here, never logged. */
  secret: string;
}

export interface WebhookDispatcherOptions {
  endpoints: readonly WebhookEndpointSecret[];
  /** One attempt at most (`WEBHOOK_TIMEOUT_MS`). */
  timeoutMs: number;
  /** Attempts before a delivery is failed (`WEBHOOK_MAX_ATTEMPTS`). */
  maxAttempts: number;
  /** Attempts in flight at once (default 64). */
  concurrency?: number;
  /** How often the outbox is looked at without a wake-up (default 1 s). */
  pollIntervalMs?: number;
  /** Added to `timeoutMs` for a claim's life (default 5 s). */
  claimMarginMs?: number;
  onOutcome?: (outcome: WebhookOutcome) => void;
  /** Failures of the dispatcher itself (the database unreachable); never a secret in them. */
  onError?: (message: string, error: unknown) => void;
  /** The attempt itself: tests replace it to hold one in flight. */
  post?: (
    delivery: ClaimedWebhookDelivery,
    secret: string,
    timeoutMs: number,
  ) => Promise<WebhookAttemptResult>;
  now?: () => number;
}

export class WebhookDispatcher {
  private readonly secrets: Map<string, string>;
  private readonly attempts = new Set<Promise<void>>();
  private readonly concurrency: number;
  private readonly pollIntervalMs: number;
  private readonly claimMs: number;
  private readonly now: () => number;
  private running = false;
  private woken = false;
  private wakeUp: (() => void) | null = null;
  private loop: Promise<void> | null = null;

  constructor(
    private readonly outbox: WebhookOutbox,
    private readonly options: WebhookDispatcherOptions,
  ) {
    this.secrets = new Map(options.endpoints.map((endpoint) => [endpoint.url, endpoint.secret]));
    this.concurrency = options.concurrency ?? 64;
    this.pollIntervalMs = options.pollIntervalMs ?? 1_000;
    this.claimMs = options.timeoutMs + (options.claimMarginMs ?? 5_000);
    this.now = options.now ?? Date.now;
  }

  /** Nothing to do without endpoints: the dispatcher then never starts. */
  get enabled(): boolean {
    return this.secrets.size > 0;
  }

  start(): void {
    if (this.running || !this.enabled) return;
    this.running = true;
    this.loop = this.run();
  }

  /** Deliveries may have been written: look now rather than at the next poll. */
  wake(): void {
    this.woken = true;
    const wakeUp = this.wakeUp;
    this.wakeUp = null;
    wakeUp?.();
  }

  /**
   * Claims nothing more and waits for the attempts in flight, at most
   * `graceMs` (each is bounded by the timeout anyway): one cut short is
   * sent again by another dispatcher, or after a restart, once its claim lapses.
   */
  async stop(graceMs = Number.POSITIVE_INFINITY): Promise<void> {
    this.running = false;
    this.wake();
    await this.loop;
    let timer: NodeJS.Timeout | undefined;
    const grace = new Promise<void>((resolve) => {
      if (Number.isFinite(graceMs)) timer = setTimeout(resolve, graceMs);
    });
    await Promise.race([Promise.all([...this.attempts]), grace]);
    clearTimeout(timer);
  }

  private async run(): Promise<void> {
    const urls = [...this.secrets.keys()];
    while (this.running) {
      this.woken = false;
      const free = this.concurrency - this.attempts.size;
      let claimed: ClaimedWebhookDelivery[] = [];
      if (free > 0) {
        try {
          claimed = await this.outbox.claimDue({
            endpointUrls: urls,
            limit: free,
            claimMs: this.claimMs,
          });
        } catch (error) {
          this.options.onError?.('could not claim webhook deliveries', error);
        }
        for (const delivery of claimed) this.attempt(delivery);
      }
      // A full batch may leave more behind it; otherwise wait for news.
      if (free > 0 && claimed.length === free) continue;
      if (!this.woken && this.running) await this.sleep();
    }
  }

  private sleep(): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wakeUp = null;
        resolve();
      }, this.pollIntervalMs);
      this.wakeUp = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  private attempt(delivery: ClaimedWebhookDelivery): void {
    const attempt = this.deliver(delivery)
      .catch((error: unknown) => {
        // The claim lapses and another attempt follows: at least once.
        this.options.onError?.(`could not record webhook delivery ${delivery.id}`, error);
      })
      .finally(() => {
        this.attempts.delete(attempt);
        // The next delivery of its conversation may be due now.
        this.wake();
      });
    this.attempts.add(attempt);
  }

  private async deliver(delivery: ClaimedWebhookDelivery): Promise<void> {
    const secret = this.secrets.get(delivery.endpointUrl);
    if (secret === undefined) return;
    const post = this.options.post ?? postWebhook;
    const result = await post(delivery, secret, this.options.timeoutMs);
    const attempts = delivery.attempts + 1;
    const status = await this.outbox.recordAttempt(
      delivery,
      result.ok
        ? { delivered: true }
        : {
            delivered: false,
            error: result.error,
            retryAt:
              attempts >= this.options.maxAttempts
                ? null
                : new Date(this.now() + retryDelayMs(attempts)),
          },
    );
    if (status === null) return;
    this.options.onOutcome?.(
      status === 'delivered' ? 'delivered' : status === 'failed' ? 'failed' : 'retried',
    );
  }
}
