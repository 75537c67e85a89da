/**
 * A session's lifecycle: open → closing (no new work; a running turn is cut)
 * → finished (nothing more is written), with why it ended. Losing the lease
 * forbids every write at once, also the last ones of a stop.
 */

/**
 * Why a session ended: `stopped` (a user's stop or `stop()`), `closed`
 * (`close()`, nothing written), `lease_lost` (a newer holder exists),
 * `start_failed` (the start threw).
 */
export type SessionEndReason = 'stopped' | 'closed' | 'lease_lost' | 'start_failed';

export class SessionLifecycle {
  /** Resolves (never rejects) once the session can write no more, with why it ended. */
  readonly closed: Promise<SessionEndReason>;
  private resolveClosed: (reason: SessionEndReason) => void = () => undefined;
  private closingNow = false;
  private writesAllowed = true;
  private finishedNow = false;
  /** `stop()` or `close()` was called: the caller finishes the session. */
  shutdownRequested = false;
  /** Why it will end, once known (the first reason wins). */
  endReason: SessionEndReason | null = null;

  constructor(
    /** Runs once when closing begins: cut the turn, end the waits. */
    private readonly onClosing: () => void,
  ) {
    this.closed = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
  }

  get isClosing(): boolean {
    return this.closingNow;
  }

  get isFinished(): boolean {
    return this.finishedNow;
  }

  /** A write may go ahead: always before closing; afterwards only a `final` one (a stop's last). */
  canWrite(final: boolean): boolean {
    return this.writesAllowed && (!this.closingNow || final);
  }

  get isWritable(): boolean {
    return this.writesAllowed;
  }

  endWith(reason: SessionEndReason): void {
    this.endReason ??= reason;
  }

  beginClosing(): void {
    this.closingNow = true;
    this.onClosing();
  }

  /** A newer holder exists: nothing more is written, whatever was under way. */
  loseLease(): void {
    this.writesAllowed = false;
    this.endReason = 'lease_lost';
    this.beginClosing();
  }

  finish(reason: SessionEndReason): void {
    if (this.finishedNow) return;
    this.finishedNow = true;
    this.writesAllowed = false;
    this.beginClosing();
    this.resolveClosed(reason);
  }
}
