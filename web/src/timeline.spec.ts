import { describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/client';
import { buildTimeline, messageTime, TOO_MANY_CONVERSATIONS, unansweredCalls } from './timeline.js';

const at = '2026-12-01T00:00:00.000Z';
let nextId = 0;
const action = (source: StoredEvent['source'], name: string, args: Record<string, unknown>) =>
  ({ id: nextId++, timestamp: at, source, action: name, args, message: '' }) as StoredEvent;
const observation = (name: string, content: string, extras: Record<string, unknown>) =>
  ({
    id: nextId++,
    timestamp: at,
    source: 'environment',
    observation: name,
    content,
    extras,
    message: '',
  }) as StoredEvent;

describe(buildTimeline.name, () => {
  it('shows user and agent messages in order, and nothing for plain state changes', () => {
    const items = buildTimeline([
      action('user', 'message', { content: 'hi' }),
      observation('agent_state_changed', '', { agent_state: 'running' }),
      action('agent', 'message', { content: 'hello', interrupted: true }),
      observation('agent_state_changed', '', { agent_state: 'awaiting_user_input' }),
    ]);
    expect(items.map((item) => item.kind)).toEqual(['user', 'agent']);
    expect(items[1]).toMatchObject({ text: 'hello', interrupted: true });
  });

  it('folds each tool call with its result, by tool_call_id', () => {
    const items = buildTimeline([
      action('agent', 'tool_call', { tool: 'a', arguments: { x: 1 }, tool_call_id: 'c1' }),
      action('agent', 'tool_call', { tool: 'b', arguments: {}, tool_call_id: 'c2' }),
      observation('tool_result', 'B done', { tool: 'b', tool_call_id: 'c2', is_error: false }),
      observation('tool_result', 'no', {
        tool: 'a',
        tool_call_id: 'c1',
        is_error: true,
        rejected: true,
      }),
    ]);
    expect(items).toHaveLength(2);
    expect(items[0]).toMatchObject({
      kind: 'tool',
      tool: 'a',
      args: { x: 1 },
      result: { content: 'no', isError: true, rejected: true },
    });
    expect(items[1]).toMatchObject({ tool: 'b', result: { content: 'B done', isError: false } });
    expect(unansweredCalls(items)).toEqual([]);
  });

  it('lists the calls still waiting for their result', () => {
    const items = buildTimeline([
      action('agent', 'tool_call', { tool: 'deploy', arguments: {}, tool_call_id: 'c9' }),
      observation('agent_state_changed', '', { agent_state: 'awaiting_user_confirmation' }),
    ]);
    expect(unansweredCalls(items)).toEqual(['deploy']);
  });

  it('shows a result whose call is not loaded on its own', () => {
    const items = buildTimeline([
      observation('tool_result', 'late', { tool: 'x', tool_call_id: 'gone', is_error: false }),
    ]);
    expect(items).toMatchObject([{ kind: 'tool', tool: 'x', args: undefined }]);
  });

  it('notes errors and an eviction for too many conversations', () => {
    const items = buildTimeline([
      observation('agent_state_changed', '', { agent_state: 'error', reason: 'max_iterations' }),
      observation('agent_state_changed', '', {
        agent_state: 'stopped',
        reason: TOO_MANY_CONVERSATIONS,
      }),
      observation('error', 'bad line', {}),
    ]);
    expect(items.map((item) => item.kind === 'note' && item.tone)).toEqual([
      'error',
      'info',
      'error',
    ]);
  });

  it('skips shapes it does not know, never throwing', () => {
    const odd = [
      { id: 1, timestamp: at, source: 'agent', action: 'message', args: { content: 3 } },
      { id: 2, timestamp: at, source: 'agent', observation: 'tool_result' },
      { id: 3 },
    ] as unknown as StoredEvent[];
    expect(buildTimeline(odd)).toEqual([]);
  });
});

describe(messageTime.name, () => {
  const now = new Date('2026-12-02T20:00:00.000Z');
  const london = { locale: 'en-GB', timeZone: 'Europe/London' };

  it("says the time of day of today's message, and the date and time of an older one", () => {
    expect(messageTime('2026-12-02T17:33:20.105Z', now, london)).toEqual({
      short: '17:33',
      full: 'Wednesday, 2 December 2026 at 17:33:20',
    });
    expect(messageTime('2026-11-30T07:05:00.000Z', now, london).short).toBe('30 Nov 2026, 07:05');
  });

  it("speaks the reader's language and counts days in the reader's time zone", () => {
    const newYork = { locale: 'en-US', timeZone: 'America/New_York' };
    // 02:00 on 3 December in UTC is still 2 December, like now, in New York.
    // (Some ICU versions put a narrow no-break space before PM.)
    const short = messageTime('2026-12-03T02:00:00.000Z', now, newYork).short;
    expect(short.replace(/\s/g, ' ')).toBe('9:00 PM');
    expect(messageTime('2026-12-03T02:00:00.000Z', now, london).short).toBe('3 Dec 2026, 02:00');
  });

  it('shows a timestamp it cannot read as it is', () => {
    expect(messageTime('not a time', now, london)).toEqual({
      short: 'not a time',
      full: 'not a time',
    });
  });
});
