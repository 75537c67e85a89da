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
 * One loop does the dispatcher's database work, one statement at a time:
 * it records the outcomes of every attempt that ended since its last round
 * in one statement, then claims, in the next, what is due (the deliveries
 * behind those just recorded among them). Attempts ending while a statement
 * runs wait for the next round rather than for a timer, and wake-ups
 * arriving meanwhile make one claim: when deliveries come faster, rounds
 * carry more of them, and the statements per delivery fall instead of
 * the database's load rising with them.
 *
 * `wake(conversationId)` says that deliveries of that conversation may have
 * been written: the next claim looks at the queues of the conversations so
 * named (and those whose attempts were just recorded), through their index,
 * at a cost that does not grow with the outbox. `wake()` and the poll, every
 * `pollIntervalMs` even while hints keep the dispatcher busy, claim from
 * every conversation, oldest first: retries come due so, and writes of other
 * processes are found so when no hint reaches this one.
 */
import type { ClaimedWebhookDelivery, WebhookAttemptRecord, WebhookOutbox } from '@cs/core';
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
  private readonly concurrency: number;
  private readonly pollIntervalMs: number;
  private readonly claimMs: number;
  private readonly now: () => number;
  /** Attempts posting now. */
  private posting = 0;
  /** Ended attempts whose outcome the next round records. */
  private ended: WebhookAttemptRecord[] = [];
  private running = false;
  /** Deliveries of any conversation may be due: the next round claims from all. */
  private claimWanted = false;
  /** Conversations whose deliveries may be due: the next round claims theirs. */
  private readonly hinted = new Set<string>();
  /** When the last claim from every conversation began (`now()`). */
  private claimedAllAt = 0;
  /** Something happened since the loop last looked (a wake-up, an attempt ended). */
  private news = false;
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
    this.claimWanted = true;
    this.loop = this.run();
  }

  /**
   * Deliveries may have been written, of `conversationId` when given: look
   * now rather than at the next poll.
   */
  wake(conversationId?: string): void {
    if (conversationId === undefined) this.claimWanted = true;
    else this.hinted.add(conversationId);
    this.notify();
  }

  /**
   * Claims nothing more and waits for the attempts in flight and the record
   * of their outcomes, at most `graceMs` (each attempt is bounded by the
   * timeout anyway): one cut short is sent again by another dispatcher, or
   * after a restart, once its claim lapses.
   */
  async stop(graceMs = Number.POSITIVE_INFINITY): Promise<void> {
    this.running = false;
    this.notify();
    let timer: NodeJS.Timeout | undefined;
    const grace = new Promise<void>((resolve) => {
      if (Number.isFinite(graceMs)) timer = setTimeout(resolve, graceMs);
    });
    await Promise.race([this.loop, grace]);
    clearTimeout(timer);
  }

  private notify(): void {
    this.news = true;
    const wakeUp = this.wakeUp;
    this.wakeUp = null;
    wakeUp?.();
  }

  /** Claiming, or attempts not yet recorded. */
  private get active(): boolean {
    return this.running || this.posting > 0 || this.ended.length > 0;
  }

  /** Rounds until stopped, then until the last attempts are recorded. */
  private async run(): Promise<void> {
    const urls = [...this.secrets.keys()];
    while (this.active) {
      this.news = false;
      if (this.ended.length > 0) {
        const records = this.ended.splice(0);
        await this.record(records);
        // The deliveries behind those may be due now.
        for (const { delivery } of records) this.hinted.add(delivery.conversationId);
      }
      if (this.now() - this.claimedAllAt >= this.pollIntervalMs) this.claimWanted = true;
      const free = this.concurrency - this.posting;
      if (this.running && free > 0 && (this.claimWanted || this.hinted.size > 0)) {
        await this.claimRound(urls, free);
        continue;
      }
      // Stopped with nothing left, news since the round began, or else wait for some.
      if (!this.active || this.news || this.ended.length > 0) continue;
      await this.sleep();
    }
  }

  /** Claims from every conversation when wanted, else from the hinted ones, and sends. */
  private async claimRound(urls: string[], free: number): Promise<void> {
    const everyConversation = this.claimWanted;
    const conversationIds = everyConversation ? undefined : [...this.hinted];
    this.claimWanted = false;
    // Found by a claim from all too: those written before it began are among its candidates.
    this.hinted.clear();
    if (everyConversation) this.claimedAllAt = this.now();
    const claimed = await this.claim(urls, free, conversationIds);
    for (const delivery of claimed) this.attempt(delivery);
    // A full batch may leave more behind it.
    if (claimed.length < free) return;
    if (conversationIds) for (const id of conversationIds) this.hinted.add(id);
    else this.claimWanted = true;
  }

  private async claim(
    urls: string[],
    limit: number,
    conversationIds: string[] | undefined,
  ): Promise<ClaimedWebhookDelivery[]> {
    try {
      return await this.outbox.claimDue({
        endpointUrls: urls,
        limit,
        claimMs: this.claimMs,
        ...(conversationIds ? { conversationIds } : {}),
      });
    } catch (error) {
      this.options.onError?.('could not claim webhook deliveries', error);
      return [];
    }
  }

  /** Until news, or the poll's time (then it claims). */
  private sleep(): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wakeUp = null;
        this.claimWanted = true;
        resolve();
      }, this.pollIntervalMs);
      this.wakeUp = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  private attempt(delivery: ClaimedWebhookDelivery): void {
    this.posting += 1;
    void this.post(delivery)
      .then(
        (record) => {
          if (record) this.ended.push(record);
        },
        (error: unknown) => {
          // Not recorded: the claim lapses and another attempt follows (at least once).
          this.options.onError?.(`could not send webhook delivery ${delivery.id}`, error);
        },
      )
      .finally(() => {
        this.posting -= 1;
        this.notify();
      });
  }

  private async post(delivery: ClaimedWebhookDelivery): Promise<WebhookAttemptRecord | null> {
    const secret = this.secrets.get(delivery.endpointUrl);
    if (secret === undefined) return null;
    const post = this.options.post ?? postWebhook;
    const result = await post(delivery, secret, this.options.timeoutMs);
    const attempts = delivery.attempts + 1;
    return {
      delivery,
      outcome: result.ok
        ? { delivered: true }
        : {
            delivered: false,
            error: result.error,
            retryAt:
              attempts >= this.options.maxAttempts
                ? null
                : new Date(this.now() + retryDelayMs(attempts)),
          },
    };
  }

  /** One statement for every outcome of the round. */
  private async record(records: WebhookAttemptRecord[]): Promise<void> {
    let statuses: Awaited<ReturnType<WebhookOutbox['recordAttempts']>>;
    try {
      statuses = await this.outbox.recordAttempts(records);
    } catch (error) {
      // The claims lapse and other attempts follow: at least once.
      this.options.onError?.(`could not record ${records.length} webhook attempt(s)`, error);
      return;
    }
    for (const status of statuses) {
      if (status === null) continue;
      this.options.onOutcome?.(
        status === 'delivered' ? 'delivered' : status === 'failed' ? 'failed' : 'retried',
      );
    }
  }
}
