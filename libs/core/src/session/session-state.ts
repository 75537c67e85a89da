/**
 * The state a session's agent sees: plain, `app:`, `user:` and `temp:` keys,
 * read at start and kept in step with the session's own writes. Other
 * conversations share the `app:` and `user:` keys: when one of them stores
 * some (`markStale`), the copy here is read again before the next step
 * (`refresh`). A session that no such change reached reads nothing.
 */
import type { StateDelta } from '../conversation.js';
import { applyDelta, isSharedKey } from '../state.js';

export class SessionState {
  private values: Record<string, unknown> = {};
  /**
   * Changes heard of, and how many of them the last read covered: a change
   * heard of while a read runs may have been missed by it, and keeps the copy
   * stale.
   */
  private changesHeard = 0;
  private changesRead = 0;

  /** A copy of every key. */
  get current(): Record<string, unknown> {
    return { ...this.values };
  }

  /** Another conversation changed `app:` or `user:` keys since they were last read. */
  get isStale(): boolean {
    return this.changesRead !== this.changesHeard;
  }

  /** The stored state, read at start (a change heard of meanwhile stays to be read). */
  load(state: Readonly<Record<string, unknown>>): void {
    this.values = { ...state };
  }

  /** A delta this session stored. */
  apply(delta: StateDelta): void {
    this.values = applyDelta(this.values, delta);
  }

  markStale(): void {
    this.changesHeard += 1;
  }

  /**
   * When stale, replaces the `app:` and `user:` keys by those `read` gives
   * (both scopes, prefixes kept); plain and `temp:` keys stay. Rejects, and
   * leaves everything as it was, when `read` does. Called between steps,
   * while none of the session's own writes is in flight: a read begun before
   * one of them committed would hide it.
   */
  async refresh(read: () => Promise<Record<string, unknown>>): Promise<void> {
    if (!this.isStale) return;
    const covered = this.changesHeard;
    const shared = await read();
    const own = Object.entries(this.values).filter(([key]) => !isSharedKey(key));
    this.values = { ...Object.fromEntries(own), ...shared };
    this.changesRead = covered;
  }
}
