/** A `ConversationBroadcaster` that records what each room was sent, for assertions. */
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { ConversationBroadcaster } from '../ports/broadcaster.port.js';

export type Broadcast =
  | { kind: 'events'; room: string; events: StoredEvent[] }
  | { kind: 'status'; room: string; status: StatusUpdate }
  | { kind: 'stream'; room: string; delta: StreamDelta };

export class RecordingBroadcaster implements ConversationBroadcaster {
  readonly sent: Broadcast[] = [];

  publishEvents(room: string, events: readonly StoredEvent[]): void {
    this.sent.push({ kind: 'events', room, events: structuredClone([...events]) });
  }

  publishStatus(room: string, status: StatusUpdate): void {
    this.sent.push({ kind: 'status', room, status: { ...status } });
  }

  publishStream(room: string, delta: StreamDelta): void {
    this.sent.push({ kind: 'stream', room, delta: { ...delta } });
  }

  /** Every stored event published to a conversation's rooms (by id or room key), in order. */
  eventsOf(conversation: string): StoredEvent[] {
    return this.sent.flatMap((b) =>
      b.kind === 'events' && inRoomOf(b.room, conversation) ? b.events : [],
    );
  }

  statusesOf(conversation: string): StatusUpdate[] {
    return this.sent.flatMap((b) =>
      b.kind === 'status' && inRoomOf(b.room, conversation) ? [b.status] : [],
    );
  }

  streamsOf(conversation: string): StreamDelta[] {
    return this.sent.flatMap((b) =>
      b.kind === 'stream' && inRoomOf(b.room, conversation) ? [b.delta] : [],
    );
  }
}

/** A room key is `<conversation id>.<incarnation>` (see `roomKey`). */
function inRoomOf(room: string, conversation: string): boolean {
  return room === conversation || room.startsWith(`${conversation}.`);
}
