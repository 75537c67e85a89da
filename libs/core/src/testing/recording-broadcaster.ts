/** A `ConversationBroadcaster` that records what each room was sent, for assertions. */
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { ConversationBroadcaster } from '../ports/broadcaster.port.js';

export type Broadcast =
  | { kind: 'events'; conversationId: string; events: StoredEvent[] }
  | { kind: 'status'; conversationId: string; status: StatusUpdate }
  | { kind: 'stream'; conversationId: string; delta: StreamDelta };

export class RecordingBroadcaster implements ConversationBroadcaster {
  readonly sent: Broadcast[] = [];

  publishEvents(conversationId: string, events: readonly StoredEvent[]): void {
    this.sent.push({ kind: 'events', conversationId, events: structuredClone([...events]) });
  }

  publishStatus(conversationId: string, status: StatusUpdate): void {
    this.sent.push({ kind: 'status', conversationId, status: { ...status } });
  }

  publishStream(conversationId: string, delta: StreamDelta): void {
    this.sent.push({ kind: 'stream', conversationId, delta: { ...delta } });
  }

  /** Every stored event published to a room, flattened in publish order. */
  eventsOf(conversationId: string): StoredEvent[] {
    return this.sent.flatMap((b) =>
      b.kind === 'events' && b.conversationId === conversationId ? b.events : [],
    );
  }

  statusesOf(conversationId: string): StatusUpdate[] {
    return this.sent.flatMap((b) =>
      b.kind === 'status' && b.conversationId === conversationId ? [b.status] : [],
    );
  }

  streamsOf(conversationId: string): StreamDelta[] {
    return this.sent.flatMap((b) =>
      b.kind === 'stream' && b.conversationId === conversationId ? [b.delta] : [],
    );
  }
}
