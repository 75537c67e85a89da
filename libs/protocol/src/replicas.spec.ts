import { describe, expect, it } from 'vitest';
import {
  InboxMessageSchema,
  RoomMessageSchema,
  ScopedStateChangeSchema,
  type StoredEvent,
} from './index.js';

const answer: StoredEvent = {
  id: 3,
  timestamp: '2026-11-30T12:00:00.000Z',
  source: 'agent',
  action: 'message',
  args: { content: 'echo: hi' },
  message: 'echo: hi',
  cause: 2,
};

describe('RoomMessageSchema', () => {
  it('reads stored events, a status update and a token delta', () => {
    const messages = [
      { type: 'events', events: [answer] },
      {
        type: 'status',
        status: { status_update: true, type: 'info', id: 'STATUS$READY', message: 'ready' },
      },
      { type: 'stream', delta: { stream: true, cause: 2, delta: 'ec', offset: 0 } },
      { type: 'catch_up', delta: { stream: true, cause: 2, delta: 'echo: h', offset: 0 } },
    ];
    for (const message of messages) {
      expect(RoomMessageSchema.parse(JSON.parse(JSON.stringify(message)))).toEqual(message);
    }
  });

  it('refuses empty batches, events without an id, and unknown kinds', () => {
    const { id: _id, ...withoutId } = answer;
    for (const message of [
      { type: 'events', events: [] },
      { type: 'events', events: [withoutId] },
      { type: 'status', status: { type: 'info' } },
      { type: 'stream', delta: { stream: true, cause: -1, delta: '' } },
      { type: 'other' },
      'events',
    ]) {
      expect(RoomMessageSchema.safeParse(message).success, JSON.stringify(message)).toBe(false);
    }
  });
});

describe('InboxMessageSchema', () => {
  it('reads wake-ups with or without their events, stops and evictions', () => {
    for (const message of [
      { type: 'wake' },
      { type: 'wake', events: [answer] },
      { type: 'stop' },
      { type: 'evict' },
      { type: 'catch_up' },
    ]) {
      expect(InboxMessageSchema.parse(message)).toEqual(message);
    }
    expect(InboxMessageSchema.safeParse({ type: 'wake', events: [{}] }).success).toBe(false);
    expect(InboxMessageSchema.safeParse({ type: 'restart' }).success).toBe(false);
  });

  it("carries a wake-up's trace and send time, and drops malformed ones without the wake-up", () => {
    const trace = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    expect(InboxMessageSchema.parse({ type: 'wake', trace, sent_at: 1_700_000_000_000 })).toEqual({
      type: 'wake',
      trace,
      sent_at: 1_700_000_000_000,
    });
    expect(
      InboxMessageSchema.parse({ type: 'wake', trace: 'not a traceparent', sent_at: -1 }),
    ).toEqual({ type: 'wake' });
  });
});

describe('ScopedStateChangeSchema', () => {
  it('reads a change of app: or user: keys and refuses anything else', () => {
    const change = {
      tenantId: 't',
      appName: 'app',
      userId: 'ada',
      app: false,
      user: true,
      origin: 'c6f1f0a0-0000-4000-8000-000000000000',
    };
    expect(ScopedStateChangeSchema.parse(JSON.parse(JSON.stringify(change)))).toEqual(change);
    const { origin: _origin, ...withoutOrigin } = change;
    for (const message of [withoutOrigin, { ...change, user: 'yes' }, { type: 'wake' }, null]) {
      expect(ScopedStateChangeSchema.safeParse(message).success, JSON.stringify(message)).toBe(
        false,
      );
    }
  });
});
