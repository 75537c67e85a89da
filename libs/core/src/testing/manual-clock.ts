/**
 * A `Clock` that moves only when a test says so: `advance(ms)` moves time and
 * fires every interval that fell due, in time order, so that idle close,
 * catch-up polls and leases are specified without waiting.
 */
import type { Clock } from '../ports/clock.port.js';

interface Timer {
  id: number;
  callback: () => void;
  every: number;
  due: number;
}

export class ManualClock implements Clock {
  private current: number;
  private nextId = 0;
  private readonly timers = new Map<number, Timer>();

  constructor(start = Date.UTC(2025, 0, 1)) {
    this.current = start;
  }

  now(): number {
    return this.current;
  }

  setInterval(callback: () => void, ms: number): { cancel(): void } {
    const every = Math.max(1, ms);
    const id = this.nextId++;
    this.timers.set(id, { id, callback, every, due: this.current + every });
    return { cancel: () => void this.timers.delete(id) };
  }

  /** Moves time forward by `ms`, firing each due interval (repeatedly if due several times). */
  advance(ms: number): void {
    const target = this.current + ms;
    for (;;) {
      const next = [...this.timers.values()]
        .filter((timer) => timer.due <= target)
        .sort((a, b) => a.due - b.due || a.id - b.id)[0];
      if (!next) break;
      this.current = next.due;
      next.due += next.every;
      next.callback();
    }
    this.current = target;
  }

  /** Intervals currently registered (cancelled ones excluded). */
  get pendingTimers(): number {
    return this.timers.size;
  }
}
