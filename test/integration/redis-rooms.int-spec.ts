// A conversation's live traffic between replicas, on real Redis: the
// broadcaster publishes on the conversation's channel, and a gateway's
// subscriber delivers it only while it holds that conversation's room open.
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  ClusterKeys,
  ConversationInbox,
  RedisRoomBroadcaster,
  RedisRoomSubscriber,
  openPublisher,
  openRedis,
} from '@cs/cluster';
import { conversationOfRoom, type RoomSink } from '@cs/core';
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import { testRedisUrl, uniqueName } from '../support/services.js';

/** What one gateway received, per conversation (a catch-up as `{ catch_up: delta }`). */
class Recorder implements RoomSink {
  readonly traffic: [string, unknown][] = [];

  publishEvents(id: string, events: readonly StoredEvent[]): void {
    this.traffic.push([id, [...events]]);
  }

  publishStatus(id: string, status: StatusUpdate): void {
    this.traffic.push([id, status]);
  }

  publishStream(id: string, delta: StreamDelta): void {
    this.traffic.push([id, delta]);
  }

  catchUpStream(id: string, delta: StreamDelta): void {
    this.traffic.push([id, { catch_up: delta }]);
  }

  of(id: string): unknown[] {
    return this.traffic.filter(([target]) => target === id).map(([, message]) => message);
  }
}

function storedEvent(id: number): StoredEvent {
  return {
    id,
    timestamp: new Date().toISOString(),
    source: 'agent',
    action: 'message',
    args: { content: `answer ${id}` },
    message: `answer ${id}`,
    cause: 0,
  };
}

const READY: StatusUpdate = {
  status_update: true,
  type: 'info',
  id: 'STATUS$READY',
  message: 'ready',
};

describe(RedisRoomSubscriber.name, () => {
  let keys: ClusterKeys;
  let publisher: Redis;
  let broadcaster: RedisRoomBroadcaster;
  /** The gateways' way to the holder: the conversation's inbox. */
  let inbox: ConversationInbox;
  const connections: Redis[] = [];

  const subscriberConnection = (name: string) => {
    const redis = openRedis(testRedisUrl(), `${keys.prefix}:${name}`);
    connections.push(redis);
    return redis;
  };
  /** A gateway's subscriber, asking the holder for catch-ups as the gateway app does. */
  const gatewaySubscriber = (name: string, connection = subscriberConnection(name)) =>
    new RedisRoomSubscriber(connection, keys, (room) => {
      void inbox.send(conversationOfRoom(room), { type: 'catch_up' });
    });

  beforeAll(() => {
    keys = new ClusterKeys(uniqueName('cs_rooms'));
    publisher = openPublisher(testRedisUrl(), `${keys.prefix}:publisher`);
    broadcaster = new RedisRoomBroadcaster(publisher, keys);
    inbox = new ConversationInbox(publisher, null, keys);
  });

  afterAll(() => {
    publisher.disconnect();
    for (const redis of connections) redis.disconnect();
  });

  it('delivers what is published once the room is open, to the gateways that opened it only', async () => {
    const first = gatewaySubscriber('gateway-1');
    const second = gatewaySubscriber('gateway-2');
    const [a, b] = [randomUUID(), randomUUID()];
    const atFirst = new Recorder();
    const atSecond = new Recorder();
    await first.open(a, atFirst);
    await second.open(b, atSecond);

    // Published right after `open` resolved: nothing may be missed.
    const events = [storedEvent(1), storedEvent(2)];
    broadcaster.publishEvents(a, events);
    broadcaster.publishStatus(a, READY);
    broadcaster.publishStream(b, { stream: true, cause: 3, delta: 'tok', offset: 0 });
    await vi.waitFor(() => {
      expect(atFirst.of(a)).toHaveLength(2);
      expect(atSecond.of(b)).toHaveLength(1);
    });

    expect(atFirst.of(a)).toEqual([events, READY]);
    expect(atSecond.of(b)).toEqual([{ stream: true, cause: 3, delta: 'tok', offset: 0 }]);
    // Neither gateway saw the other's conversation.
    expect(atFirst.of(b)).toEqual([]);
    expect(atSecond.of(a)).toEqual([]);
    // Redis has one receiver per conversation: the gateway that opened its room.
    const reply = (await publisher.pubsub(
      'SHARDNUMSUB',
      keys.conversationRoom(a),
      keys.conversationRoom(b),
    )) as (string | number)[];
    expect(reply.map(String)).toEqual([
      keys.conversationRoom(a),
      '1',
      keys.conversationRoom(b),
      '1',
    ]);
  });

  it('gives a gateway that opens a room mid-step the text so far from the holder, in order with what follows, and keeps no copy in Redis', async () => {
    const room = randomUUID();
    const delta = (text: string, offset: number, cause = 7): StreamDelta => ({
      stream: true,
      cause,
      delta: text,
      offset,
    });
    // The holder: the worker's inbox for the conversation answers a catch-up request.
    const holderInbox = new ConversationInbox(publisher, subscriberConnection('holder'), keys);
    let requests = 0;
    await holderInbox.listen(conversationOfRoom(room), (message) => {
      if (message.type !== 'catch_up') return;
      broadcaster.publishCatchUp(room);
      requests += 1;
    });
    /** A gateway opening the room now: what reaches it up to a status published after the holder answered. */
    const late = async (name: string) => {
      const recorder = new Recorder();
      const subscriber = gatewaySubscriber(name);
      const before = requests;
      await subscriber.open(room, recorder);
      await vi.waitFor(() => expect(requests).toBe(before + 1));
      broadcaster.publishStatus(room, READY);
      await vi.waitFor(() => expect(recorder.of(room).at(-1)).toEqual(READY));
      return { recorder, subscriber };
    };
    let text = '';
    for (let i = 0; i < 200; i += 1) {
      const piece = `t${i} `;
      broadcaster.publishStream(room, delta(piece, text.length));
      text += piece;
    }
    const first = await late('late-1');
    expect(first.recorder.of(room)).toEqual([{ catch_up: delta(text, 0) }, READY]);
    // What follows comes after it, continuing from its end.
    broadcaster.publishStream(room, delta('more', text.length));
    await vi.waitFor(() => expect(first.recorder.of(room)).toHaveLength(3));
    expect(first.recorder.of(room)[2]).toEqual(delta('more', text.length));
    first.subscriber.close(room);
    // Nothing of the step's text is kept in Redis.
    expect(await publisher.keys(`${keys.prefix}:*`)).toEqual([]);
    // A new step (offset 0) starts its text afresh.
    broadcaster.publishStream(room, delta('new', 0, 9));
    expect((await late('late-2')).recorder.of(room)).toEqual([
      { catch_up: delta('new', 0, 9) },
      READY,
    ]);
    // A gap makes the text unknown: a late gateway gets none rather than a wrong one.
    broadcaster.publishStream(room, delta('lost', 10, 9));
    expect((await late('late-3')).recorder.of(room)).toEqual([READY]);
    // The step's stored answer ends the stream.
    broadcaster.publishStream(room, delta('again', 0, 11));
    broadcaster.publishEvents(room, [{ ...storedEvent(12), cause: 11 }]);
    expect((await late('late-4')).recorder.of(room)).toEqual([READY]);
  });

  it('stops delivering once the room is closed', async () => {
    const subscriber = gatewaySubscriber('closing');
    const id = randomUUID();
    const recorder = new Recorder();
    await subscriber.open(id, recorder);
    broadcaster.publishStatus(id, READY);
    await vi.waitFor(() => expect(recorder.of(id)).toHaveLength(1));

    subscriber.close(id);
    await vi.waitFor(async () => {
      const reply = await publisher.pubsub('SHARDNUMSUB', keys.conversationRoom(id));
      expect(Number(reply[1])).toBe(0);
    });
    broadcaster.publishEvents(id, [storedEvent(5)]);
    // A later room shows that the late publish had time to arrive.
    const later = randomUUID();
    await subscriber.open(later, recorder);
    broadcaster.publishStatus(later, READY);
    await vi.waitFor(() => expect(recorder.of(later)).toHaveLength(1));
    expect(recorder.of(id)).toHaveLength(1);
  });

  it('drops traffic that is not a room message, and goes on delivering', async () => {
    const subscriber = gatewaySubscriber('garbage');
    const id = randomUUID();
    const recorder = new Recorder();
    await subscriber.open(id, recorder);
    const channel = keys.conversationRoom(id);
    await publisher.spublish(channel, 'not json');
    await publisher.spublish(channel, JSON.stringify({ type: 'events', events: [{ id: 'x' }] }));
    await publisher.spublish(channel, JSON.stringify({ type: 'events', events: [] }));
    await publisher.spublish(channel, JSON.stringify({ type: 'unknown' }));
    broadcaster.publishStatus(id, READY);
    await vi.waitFor(() => expect(recorder.of(id)).toEqual([READY]));
  });

  it('resubscribes after its connection dropped, then asks its rooms to catch up from the store', async () => {
    const connection = subscriberConnection('dropping');
    const clientId = await connection.client('ID');
    const subscriber = gatewaySubscriber('dropping', connection);
    const resyncs: number[] = [];
    subscriber.onResync(() => resyncs.push(Date.now()));
    const id = randomUUID();
    const recorder = new Recorder();
    await subscriber.open(id, recorder);

    await publisher.client('KILL', 'ID', String(clientId));
    await vi.waitFor(() => expect(resyncs).toHaveLength(1), { timeout: 10_000 });
    // By the time the rooms resync, the subscription is back: nothing after it is missed.
    broadcaster.publishEvents(id, [storedEvent(7)]);
    await vi.waitFor(() => expect(recorder.of(id)).toHaveLength(1));
  });
});

describe(ConversationInbox.name, () => {
  it('tells its holder that wake-ups may be missed while its subscription is down, and hears them again once it is back', async () => {
    const keys = new ClusterKeys(uniqueName('cs_inbox'));
    const publisher = openPublisher(testRedisUrl(), `${keys.prefix}:publisher`);
    const connection = openRedis(testRedisUrl(), `${keys.prefix}:inbox`);
    try {
      const clientId = await connection.client('ID');
      const gateway = new ConversationInbox(publisher, null, keys);
      const holder = new ConversationInbox(publisher, connection, keys);
      let troubles = 0;
      holder.onListenTrouble(() => (troubles += 1));
      const id = randomUUID();
      const heard: string[] = [];
      await holder.listen(id, (message) => heard.push(message.type));
      expect(await gateway.send(id, { type: 'settings' })).toBe(1);
      expect(troubles).toBe(0);

      await publisher.client('KILL', 'ID', String(clientId));
      await vi.waitFor(() => expect(troubles).toBeGreaterThan(0), { timeout: 10_000 });
      // Subscribed again: wake-ups reach it as before.
      await vi.waitFor(async () => expect(await gateway.send(id, { type: 'stop' })).toBe(1), {
        timeout: 10_000,
      });
      await vi.waitFor(() => expect(heard).toContain('stop'));
      expect(heard[0]).toBe('settings');
    } finally {
      publisher.disconnect();
      connection.disconnect();
    }
  });
});
