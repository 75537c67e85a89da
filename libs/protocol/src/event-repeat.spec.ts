import { describe, expect, it } from 'vitest';
import { isSameEvent, jsonEqual, storedPayload } from './event-repeat.js';
import type { StoredEvent } from './events.js';

const stored: StoredEvent = {
  id: 4,
  timestamp: '2026-12-01T12:00:00.000Z',
  source: 'user',
  cause: 2,
  action: 'message',
  args: { content: 'hi', image_urls: [], file_urls: [] },
  message: 'hi',
  client_event_id: 'k1',
};
const resend = {
  source: 'user',
  body: {
    action: 'message',
    args: { content: 'hi', image_urls: [], file_urls: [] },
    message: 'hi',
  },
};

describe('isSameEvent', () => {
  it('takes a resend of the stored event as the same event, whatever its envelope', () => {
    expect(isSameEvent({ source: stored.source, body: stored }, resend)).toBe(true);
  });

  it('compares what jsonb keeps: key order, undefined members and toJSON do not matter', () => {
    const reordered = {
      source: 'user',
      body: {
        message: 'hi',
        args: { file_urls: [], content: 'hi', image_urls: [], timestamp: undefined },
        action: 'message',
      },
    };
    expect(isSameEvent({ source: stored.source, body: stored }, reordered)).toBe(true);
    const at = new Date('2026-12-01T12:00:00.000Z');
    expect(
      isSameEvent(
        { source: 'user', body: { action: 'a', args: { at: at.toISOString() }, message: '' } },
        { source: 'user', body: { action: 'a', args: { at }, message: '' } },
      ),
    ).toBe(true);
  });

  it('tells another source, content or shape apart', () => {
    const same = { source: stored.source, body: stored };
    expect(isSameEvent(same, { ...resend, source: 'agent' })).toBe(false);
    expect(
      isSameEvent(same, { ...resend, body: { ...resend.body, args: { content: 'hello' } } }),
    ).toBe(false);
    expect(isSameEvent(same, { ...resend, body: { ...resend.body, message: 'hi ' } })).toBe(false);
    expect(isSameEvent(same, { ...resend, body: { ...resend.body, extra: 1 } })).toBe(false);
  });

  it('ignores envelope keys in either body, as the store never keeps them in the payload', () => {
    expect(
      storedPayload({
        id: 1,
        timestamp: 't',
        source: 'user',
        cause: 0,
        client_event_id: 'k',
        a: 1,
      }),
    ).toEqual({ a: 1 });
  });
});

describe('jsonEqual', () => {
  it('ignores key order but not values, lengths or types', () => {
    expect(jsonEqual({ a: 1, b: [1, { c: 2 }] }, { b: [1, { c: 2 }], a: 1 })).toBe(true);
    expect(jsonEqual({ a: 1 }, { a: 1, b: 2 })).toBe(false);
    expect(jsonEqual([1, 2], [2, 1])).toBe(false);
    expect(jsonEqual({ a: '1' }, { a: 1 })).toBe(false);
    expect(jsonEqual([], {})).toBe(false);
    expect(jsonEqual(null, {})).toBe(false);
  });
});
