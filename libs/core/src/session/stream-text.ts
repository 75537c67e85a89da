/**
 * A step's streamed text as the rooms see it, assembled from its deltas by
 * offset, so that a client joining mid-step gets the text so far in one
 * delta (PROTOCOL.md "Streaming"). Kept by the local room hub and, in a
 * cluster, by the broadcaster that leaves a copy in Redis for gateways that
 * open the room later.
 */
import { isSettledState, readAgentState } from '@cs/protocol';
import type { StoredEvent, StreamDelta } from '@cs/protocol';

/** A step's streamed text, assembled from its deltas by offset. */
export class StreamText {
  constructor(
    readonly cause: number,
    private text: string,
  ) {}

  get content(): string {
    return this.text;
  }

  /** False when the delta does not follow on (a gap): the text is then unknown. */
  apply(delta: StreamDelta): boolean {
    if (delta.offset > this.text.length) return false;
    // The usual case appends; only a rewrite from an earlier offset copies.
    this.text =
      delta.offset === this.text.length
        ? this.text + delta.delta
        : this.text.slice(0, delta.offset) + delta.delta;
    return true;
  }
}

/** A stored message or a settled state change of the turn `cause` ends its stream. */
export function endsStream(event: StoredEvent, cause: number): boolean {
  if (event.cause !== cause) return false;
  if ('action' in event) return event.action === 'message' || event.action === 'tool_call';
  const state = readAgentState(event);
  return state !== null && isSettledState(state);
}

/** The text after `delta`: started afresh at offset 0, extended, or unknown (null) after a gap. */
export function nextStreamText(current: StreamText | null, delta: StreamDelta): StreamText | null {
  if (delta.offset === 0 || current?.cause !== delta.cause) {
    return delta.offset === 0 ? new StreamText(delta.cause, delta.delta) : null;
  }
  return current.apply(delta) ? current : null;
}
