/**
 * A step's streamed text as the rooms see it, assembled from its deltas by
 * offset, so that a client joining mid-step gets the text so far in one
 * delta (docs/protocol.md "Streaming"). Kept by the local room hub and, in a
 * cluster, by the holder's broadcaster, which sends it to a gateway that
 * opens the room later and asks for it.
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

/** Rooms streaming at once whose text one process keeps; past it the least recently streamed go. */
export const MAX_TRACKED_STREAMS = 10_000;

/**
 * The text each room's current step has streamed so far, as one process
 * knows it from the deltas it passes on: for a bounded number of rooms, the
 * least recently streamed dropped first. Each room's text is dropped after a
 * gap and once a stored event ends its stream.
 */
export class RoomStreams {
  private readonly texts = new Map<string, StreamText>();

  get(room: string): StreamText | undefined {
    return this.texts.get(room);
  }

  /** The room's text after `delta`; null, and forgotten, when it is unknown after a gap. */
  apply(room: string, delta: StreamDelta): StreamText | null {
    const next = nextStreamText(this.texts.get(room) ?? null, delta);
    // Most recently streamed last.
    this.texts.delete(room);
    if (!next) return null;
    this.texts.set(room, next);
    if (this.texts.size > MAX_TRACKED_STREAMS) {
      this.texts.delete(this.texts.keys().next().value as string);
    }
    return next;
  }

  /** Forgets the room's text when one of `events` ends its stream; true when one did. */
  endWith(room: string, events: readonly StoredEvent[]): boolean {
    const text = this.texts.get(room);
    if (!text || !events.some((event) => endsStream(event, text.cause))) return false;
    this.texts.delete(room);
    return true;
  }

  delete(room: string): void {
    this.texts.delete(room);
  }
}
