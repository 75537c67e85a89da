import { describe, expect, it } from 'vitest';
import type { RoomSink } from '@cs/core';
import type { ServerEvent, StoredEvent } from '@cs/protocol';
import {
  ConversationRoomHub,
  type ConversationSubscriber,
  type RoomTrafficSource,
} from './conversation-room-hub.js';

/** A traffic source whose subscriptions the test confirms by hand. */
class ManualSource implements RoomTrafficSource {
  readonly opened: string[] = [];
  readonly closed: string[] = [];
  readonly sinks = new Map<string, RoomSink>();
  private readonly confirms = new Map<string, () => void>();

  open(conversationId: string, sink: RoomSink): Promise<void> {
    this.opened.push(conversationId);
    this.sinks.set(conversationId, sink);
    return new Promise((resolve) => this.confirms.set(conversationId, resolve));
  }

  close(conversationId: string): void {
    this.closed.push(conversationId);
  }

  confirm(conversationId: string): void {
    this.confirms.get(conversationId)?.();
  }
}

function subscriber(): ConversationSubscriber & { received: ServerEvent[]; resyncs: number } {
  const received: ServerEvent[] = [];
  const self = {
    received,
    resyncs: 0,
    offerEvents: (events: readonly StoredEvent[]) => received.push(...events),
    sendStatus: (status: ServerEvent) => received.push(status),
    sendStream: (delta: ServerEvent) => received.push(delta),
    resync: () => (self.resyncs += 1),
  };
  return self;
}

const event = (id: number): StoredEvent => ({
  id,
  timestamp: '2026-11-30T00:00:00.000Z',
  source: 'user',
  action: 'message',
  args: { content: 'hi' },
  message: 'hi',
});

const settled = async (promise: Promise<void>) => {
  let done = false;
  void promise.then(() => (done = true));
  await new Promise((resolve) => setImmediate(resolve));
  return done;
};

describe(ConversationRoomHub.name, () => {
  it('opens a room at its first subscriber, shares it, and closes it after its last', async () => {
    const source = new ManualSource();
    const hub = new ConversationRoomHub(source);
    const first = hub.join('c1', subscriber());
    const second = hub.join('c1', subscriber());
    expect(source.opened).toEqual(['c1']);
    expect(await settled(first.ready)).toBe(false);

    source.confirm('c1');
    expect(await settled(first.ready)).toBe(true);
    expect(await settled(second.ready)).toBe(true);

    first.leave();
    expect(source.closed).toEqual([]);
    second.leave();
    expect(source.closed).toEqual(['c1']);
    expect(hub.hasSubscribers('c1')).toBe(false);
    hub.join('c1', subscriber());
    expect(source.opened).toEqual(['c1', 'c1']);
  });

  it("delivers a room's traffic from its source to that room's subscribers only", () => {
    const source = new ManualSource();
    const hub = new ConversationRoomHub(source);
    const [a1, a2, b] = [subscriber(), subscriber(), subscriber()];
    hub.join('a', a1);
    hub.join('a', a2);
    hub.join('b', b);

    source.sinks.get('a')!.publishEvents('a', [event(0), event(1)]);
    source.sinks.get('b')!.publishStream('b', { stream: true, cause: 0, delta: 'x', offset: 0 });

    expect(a1.received.map((e) => ('id' in e ? e.id : e))).toEqual([0, 1]);
    expect(a2.received).toHaveLength(2);
    expect(b.received).toEqual([{ stream: true, cause: 0, delta: 'x', offset: 0 }]);
    expect(hub.subscriberCount).toBe(3);
  });

  it('without a source (one process) is ready at once and is itself the broadcaster', async () => {
    const hub = new ConversationRoomHub();
    const local = subscriber();
    const membership = hub.join('c', local);
    expect(await settled(membership.ready)).toBe(true);
    hub.publishStatus('c', { status_update: true, type: 'info', id: 'STATUS$READY', message: '' });
    hub.resyncAll();
    expect(local.received).toHaveLength(1);
    expect(local.resyncs).toBe(1);
    membership.leave();
    hub.publishEvents('c', [event(2)]);
    expect(local.received).toHaveLength(1);
  });

  describe("a step's text so far, for late joiners", () => {
    const delta = (offset: number, text: string) => ({
      stream: true as const,
      cause: 4,
      delta: text,
      offset,
    });
    const answer: StoredEvent = {
      id: 5,
      timestamp: '2026-11-30T00:00:00.000Z',
      source: 'agent',
      action: 'message',
      args: { content: 'Hello world' },
      message: 'Hello world',
      cause: 4,
    };

    /** A cluster gateway's hub with room `c` open, its source confirmed, and `member` in it. */
    const openRoom = async (member: ConversationSubscriber) => {
      const source = new ManualSource();
      const hub = new ConversationRoomHub(source);
      const membership = hub.join('c', member);
      source.confirm('c');
      await membership.ready;
      return { hub, sink: source.sinks.get('c')! };
    };

    it('without a source, is kept for a room nobody has joined: the first client mid-step gets it', () => {
      const hub = new ConversationRoomHub();
      hub.publishStream('c', delta(0, 'Hello'));
      hub.publishStream('c', delta(5, ' wor'));
      expect(hub.streamOf('c')).toEqual(delta(0, 'Hello wor'));
      // Leaving does not forget it: the step still runs, and a reconnect needs it.
      hub.join('c', subscriber()).leave();
      expect(hub.streamOf('c')).toEqual(delta(0, 'Hello wor'));
      hub.publishEvents('c', [answer]);
      expect(hub.streamOf('c')).toBeNull();
    });

    it('with a source, is kept for open rooms only', async () => {
      const source = new ManualSource();
      const hub = new ConversationRoomHub(source);
      hub.publishStream('c', delta(0, 'Hello'));
      expect(hub.streamOf('c')).toBeNull();
      const membership = hub.join('c', subscriber());
      source.confirm('c');
      await membership.ready;
      source.sinks.get('c')!.publishStream('c', delta(0, 'Hello'));
      source.sinks.get('c')!.publishStream('c', delta(5, ' wor'));
      expect(hub.streamOf('c')).toEqual(delta(0, 'Hello wor'));
      membership.leave();
      expect(hub.streamOf('c')).toBeNull();
    });

    it('with a source, a room opened mid-step passes nothing on until the catch-up, then the text so far and what follows', async () => {
      const early = subscriber();
      const { hub, sink } = await openRoom(early);
      // Published before the holder answered the gateway: the catch-up holds them.
      sink.publishStream('c', delta(5, ' wor'));
      expect(early.received).toEqual([]);
      sink.catchUpStream('c', delta(0, 'Hello wor'));
      sink.publishStream('c', delta(9, 'ld'));
      expect(early.received).toEqual([delta(0, 'Hello wor'), delta(9, 'ld')]);
      expect(hub.streamOf('c')).toEqual(delta(0, 'Hello world'));
    });

    it("with a source, ignores a catch-up of a step whose text it knows (another gateway's request)", async () => {
      const following = subscriber();
      const { hub, sink } = await openRoom(following);
      sink.publishStream('c', delta(0, 'Hello'));
      sink.catchUpStream('c', delta(0, 'Hello'));
      expect(following.received).toEqual([delta(0, 'Hello')]);
      // After a gap the text is unknown: deltas stop, and a catch-up repairs it.
      sink.publishStream('c', delta(9, 'ld'));
      expect(following.received).toEqual([delta(0, 'Hello')]);
      sink.catchUpStream('c', delta(0, 'Hello world'));
      expect(following.received).toEqual([delta(0, 'Hello'), delta(0, 'Hello world')]);
      // A catch-up for a room this gateway does not hold, or not from offset 0, is dropped.
      sink.catchUpStream('other', delta(0, 'x'));
      sink.catchUpStream('c', { ...delta(3, 'x'), cause: 6 });
      expect(following.received).toHaveLength(2);
      expect(hub.streamOf('other')).toBeNull();
    });
  });
});
