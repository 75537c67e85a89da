/**
 * How a session's loop waits: for a wake-up (new user events stored, a
 * catch-up poll, closing), or for the backoff after a failed store write,
 * which a wake-up or closing also ends early.
 */
import { backoffDelay } from '@cs/protocol';

/** After a failed store write the loop waits this long, doubled each time, before trying again. */
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 5_000;

export class WakeSignal {
  private raised = false;
  private waiter: (() => void) | null = null;
  private backoffWaiter: (() => void) | null = null;

  /** A wake-up came since the loop last looked. */
  get isRaised(): boolean {
    return this.raised;
  }

  raise(): void {
    this.raised = true;
    this.releaseWaiter();
  }

  /** The loop looks now: later wake-ups count anew. */
  clear(): void {
    this.raised = false;
  }

  /** Resolves at the next wake-up (at once if one came, or if `ended`). */
  wait(ended: boolean): Promise<void> {
    if (this.raised || ended) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiter = resolve;
    });
  }

  /** Waits out the backoff of the `failures`-th failure in a row. */
  backOff(failures: number): Promise<void> {
    const delay = backoffDelay(failures - 1, { baseMs: RETRY_BASE_MS, maxMs: RETRY_MAX_MS });
    return new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, delay);
      timer.unref();
      this.backoffWaiter = () => {
        clearTimeout(timer);
        resolve();
      };
    }).finally(() => {
      this.backoffWaiter = null;
    });
  }

  /** Ends every wait (closing). */
  releaseAll(): void {
    this.releaseWaiter();
    this.backoffWaiter?.();
  }

  private releaseWaiter(): void {
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.();
  }
}
