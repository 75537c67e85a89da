import { describe, expect, it, vi } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { OrderedEventFeed } from './ordered-event-feed.js';

function event(id: number): StoredEvent {
  return {
    id,
    timestamp: new Date(0).toISOString(),
    source: 'user',
    action: 'message',
    args: { content: `m${id}` },
    message: `m${id}`,
  };
}

/** A store holding events 0..last-1, readable in pages; reads can be held. */
function storeOf(last: number) {
  const stored = Array.from({ length: last }, (_, id) => event(id));
  let gate: Promise<void> = Promise.resolve();
  const read = vi.fn(async (fromId: number, toId: number | undefined, limit: number) => {
    await gate;
    const range = stored.filter((e) => e.id >= fromId && (toId === undefined || e.id <= toId));
    return { events: range.slice(0, limit), hasMore: range.length > limit };
  });
  return {
    stored,
    read,
    append: (count: number) => {
      const added = Array.from({ length: count }, () => event(stored.length)).map((e, n) => ({
        ...e,
        id: stored.length + n,
      }));
      stored.push(...added);
      return added;
    },
    hold() {
      let release = () => undefined as void;
      gate = new Promise<void>((resolve) => (release = resolve));
      return () => release();
    },
  };
}

describe(OrderedEventFeed.name, () => {
  it('reads on while pages say more follow, however short they are', async () => {
    const stored = Array.from({ length: 7 }, (_, id) => event(id));
    // Pages cut by bytes: two events each, well under the page size.
    const read = vi.fn(async (fromId: number) => {
      const range = stored.filter((e) => e.id >= fromId);
      return { events: range.slice(0, 2), hasMore: range.length > 2 };
    });
    const sent: number[] = [];
    const feed = new OrderedEventFeed({ afterId: -1, read, send: (e) => sent.push(e.id) });
    await feed.start();
    expect(sent).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(read).toHaveBeenCalledTimes(4);
  });

  it('waits for the subscriber before each page of a replay', async () => {
    const store = storeOf(30);
    const sent: number[] = [];
    let release: () => void = () => undefined;
    let waits = 0;
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
      pageSize: 10,
      beforePage: () => {
        waits += 1;
        if (waits === 2) return new Promise<void>((resolve) => (release = resolve));
        return Promise.resolve();
      },
    });
    const started = feed.start();
    await vi.waitFor(() => expect(waits).toBe(2));
    expect(sent).toHaveLength(10); // the second page waits for the client
    release();
    await started;
    expect(sent).toHaveLength(30);
  });

  it('replays everything after the cursor, in pages, then delivers live events', async () => {
    const store = storeOf(25);
    const sent: number[] = [];
    const feed = new OrderedEventFeed({
      afterId: 4,
      read: store.read,
      send: (e) => sent.push(e.id),
      pageSize: 10,
    });
    await feed.start();
    expect(sent).toEqual(Array.from({ length: 20 }, (_, n) => n + 5));
    feed.offer(store.append(2));
    expect(sent.slice(-2)).toEqual([25, 26]);
    expect(feed.lastDeliveredId).toBe(26);
  });

  it('holds live events that arrive during the replay and sends each id once', async () => {
    const store = storeOf(10);
    const sent: number[] = [];
    const release = store.hold();
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
    });
    const started = feed.start();
    // Appended while the replay's read is in flight: offered live, and maybe read too.
    const live = store.append(3);
    feed.offer(live);
    feed.offer([live[0]!]);
    release();
    await started;
    expect(sent).toEqual(Array.from({ length: 13 }, (_, n) => n));
  });

  it('ignores live events offered before start', async () => {
    const store = storeOf(3);
    const sent: number[] = [];
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
    });
    feed.offer([event(1)]);
    expect(sent).toEqual([]);
    await feed.start();
    expect(sent).toEqual([0, 1, 2]);
  });

  it('reorders events that arrive out of order without reading the store', async () => {
    const store = storeOf(0);
    const sent: number[] = [];
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
      gapWaitMs: 1000,
    });
    await feed.start();
    const calls = store.read.mock.calls.length;
    const [a, b, c] = store.append(3);
    feed.offer([c!]);
    feed.offer([b!]);
    expect(sent).toEqual([]);
    feed.offer([a!]);
    expect(sent).toEqual([0, 1, 2]);
    expect(store.read.mock.calls.length).toBe(calls);
    feed.close();
  });

  it('fills a gap that does not close by itself from the store', async () => {
    vi.useFakeTimers();
    try {
      const store = storeOf(2);
      const sent: number[] = [];
      const feed = new OrderedEventFeed({
        afterId: -1,
        read: store.read,
        send: (e) => sent.push(e.id),
        gapWaitMs: 20,
      });
      await feed.start();
      const added = store.append(3); // 2, 3, 4: the publish of 2 and 3 is lost
      feed.offer([added[2]!]);
      expect(sent).toEqual([0, 1]);
      await vi.advanceTimersByTimeAsync(25);
      expect(sent).toEqual([0, 1, 2, 3, 4]);
    } finally {
      vi.useRealTimers();
    }
  });

  it('catches up on resync after live traffic was lost', async () => {
    const store = storeOf(1);
    const sent: number[] = [];
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
    });
    await feed.start();
    store.append(2);
    feed.resync();
    await vi.waitFor(() => expect(sent).toEqual([0, 1, 2]));
  });

  it('sends nothing after close', async () => {
    const store = storeOf(0);
    const sent: number[] = [];
    const feed = new OrderedEventFeed({
      afterId: -1,
      read: store.read,
      send: (e) => sent.push(e.id),
    });
    await feed.start();
    feed.close();
    feed.offer(store.append(1));
    expect(sent).toEqual([]);
  });
});
