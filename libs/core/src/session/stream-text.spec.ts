import type { StoredEvent } from '@cs/protocol';
import { describe, expect, it } from 'vitest';
import {
  MAX_TRACKED_STREAMS,
  RoomStreams,
  StreamText,
  endsStream,
  nextStreamText,
} from './stream-text.js';

const delta = (cause: number, text: string, offset: number) => ({
  stream: true as const,
  cause,
  delta: text,
  offset,
});

describe(StreamText.name, () => {
  it('appends deltas that follow on, rewrites from an earlier offset, and forgets after a gap', () => {
    let text = nextStreamText(null, delta(3, 'Hel', 0));
    text = nextStreamText(text, delta(3, 'lo', 3));
    expect(text?.content).toBe('Hello');
    text = nextStreamText(text, delta(3, 'p!', 3));
    expect(text?.content).toBe('Help!');
    expect(nextStreamText(text, delta(3, 'x', 9))).toBeNull();
    expect(nextStreamText(text, delta(4, 'new', 0))?.content).toBe('new');
    expect(nextStreamText(null, delta(4, 'late', 2))).toBeNull();
  });
});

describe('endsStream', () => {
  const envelope = { id: 9, timestamp: '2026-12-01T12:00:00.000Z', cause: 3 };
  const stateChange = (agent_state: unknown): StoredEvent => ({
    ...envelope,
    source: 'environment',
    observation: 'agent_state_changed',
    content: '',
    extras: { agent_state },
    message: '',
  });
  const action = (name: string): StoredEvent => ({
    ...envelope,
    source: 'agent',
    action: name,
    args: {},
    message: '',
  });

  it('ends the turn’s stream on its stored message, tool call or settled state change', () => {
    expect(endsStream(action('message'), 3)).toBe(true);
    expect(endsStream(action('tool_call'), 3)).toBe(true);
    expect(endsStream(stateChange('awaiting_user_input'), 3)).toBe(true);
    expect(endsStream(stateChange('error'), 3)).toBe(true);
  });

  it('does not end it on another turn’s events, a running state or an unknown one', () => {
    expect(endsStream(action('message'), 4)).toBe(false);
    expect(endsStream(action('think'), 3)).toBe(false);
    expect(endsStream(stateChange('running'), 3)).toBe(false);
    expect(endsStream(stateChange('loading'), 3)).toBe(false);
    expect(endsStream(stateChange('dancing'), 3)).toBe(false);
  });
});

describe(RoomStreams.name, () => {
  it("keeps each room's text, forgets it after a gap and when a stored event ends it", () => {
    const streams = new RoomStreams();
    expect(streams.apply('a', delta(1, 'Hel', 0))?.content).toBe('Hel');
    expect(streams.apply('a', delta(1, 'lo', 3))?.content).toBe('Hello');
    expect(streams.apply('b', delta(2, 'gap', 4))).toBeNull();
    expect(streams.get('b')).toBeUndefined();
    const other = {
      id: 9,
      timestamp: '',
      source: 'agent',
      cause: 7,
      action: 'message',
      args: {},
      message: '',
    };
    expect(streams.endWith('a', [other as StoredEvent])).toBe(false);
    expect(streams.endWith('a', [{ ...other, cause: 1 } as StoredEvent])).toBe(true);
    expect(streams.get('a')).toBeUndefined();
  });

  it('keeps at most MAX_TRACKED_STREAMS rooms, dropping the least recently streamed', () => {
    const streams = new RoomStreams();
    for (let room = 0; room < MAX_TRACKED_STREAMS; room += 1)
      streams.apply(`r${room}`, delta(1, 'x', 0));
    streams.apply('r0', delta(1, 'y', 1)); // streamed again: now the most recent
    streams.apply('new', delta(1, 'z', 0));
    expect(streams.get('r0')?.content).toBe('xy');
    expect(streams.get('r1')).toBeUndefined();
    expect(streams.get('new')?.content).toBe('z');
  });
});
