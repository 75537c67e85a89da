/**
 * A step's streamed text on its way to the room: each published delta
 * carries its `offset` (UTF-16 units of the step's text before it). The first
 * delta after a quiet spell leaves at once; deltas that follow within
 * `BATCH_MS` go out together, so that a fast model costs one publish (one
 * Redis message, one socket frame) per batch rather than per token.
 */
import type { StreamDelta } from '@cs/protocol';

export const DELTA_BATCH_MS = 8;

export class DeltaStream {
  private text = '';
  /** The offset of the first unpublished character. */
  private published = 0;
  private timer: NodeJS.Timeout | undefined;
  private lastFlushAt = 0;

  constructor(
    private readonly cause: number,
    private readonly publish: (delta: StreamDelta) => void,
    private readonly now: () => number = Date.now,
  ) {}

  /** The step's text so far. */
  get content(): string {
    return this.text;
  }

  push(delta: string): void {
    if (delta === '') return;
    this.text += delta;
    if (this.timer) return;
    const wait = this.lastFlushAt + DELTA_BATCH_MS - this.now();
    if (wait <= 0) {
      this.flush();
      return;
    }
    this.timer = setTimeout(() => this.flush(), wait);
    this.timer.unref();
  }

  /** The text starts afresh (a retried model request): the next delta has offset 0. */
  restart(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.text = '';
    this.published = 0;
  }

  /** Publishes what waits (at the end of a step). */
  flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (this.published === this.text.length) return;
    const delta = this.text.slice(this.published);
    const offset = this.published;
    this.published = this.text.length;
    this.lastFlushAt = this.now();
    this.publish({ stream: true, cause: this.cause, delta, offset });
  }

  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
