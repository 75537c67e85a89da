import { describe, expect, it } from 'vitest';
import type { AgentState, StoredEvent } from '@cs/protocol';
import { TurnTracker } from './turn-tracker.js';

const at = '2026-01-01T00:00:00.000Z';
const user = (id: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'user',
  action: 'message',
  args: { content: `message ${id}` },
  message: `message ${id}`,
});
const agent = (id: number, cause: number, action = 'message'): StoredEvent => ({
  id,
  timestamp: at,
  source: 'agent',
  action,
  args: {},
  message: '',
  cause,
});
const state = (id: number, agentState: AgentState, cause?: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'environment',
  observation: 'agent_state_changed',
  content: '',
  extras: { agent_state: agentState },
  message: '',
  ...(cause === undefined ? {} : { cause }),
});

const rewind = (id: number, to: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'user',
  action: 'rewind',
  args: { to_event_id: to },
  message: '',
});

function track(eventId: number, events: StoredEvent[]): TurnTracker {
  const tracker = new TurnTracker(eventId);
  for (const event of events) tracker.add(event);
  return tracker;
}

describe(TurnTracker.name, () => {
  it('is pending until the turn stores something', () => {
    const tracker = track(3, [user(3), user(4), state(5, 'running', 1)]);
    expect(tracker.status).toBe('pending');
    expect(tracker.agentState).toBeNull();
    expect(tracker.answered).toBe(false);
  });

  it('runs from its running state and completes at its settled state, with its own events only', () => {
    const tracker = track(3, [state(4, 'running', 3), user(5)]);
    expect(tracker.status).toBe('running');
    tracker.add(agent(6, 3));
    tracker.add(state(7, 'awaiting_user_input', 3));
    tracker.add(state(8, 'running', 5));
    expect(tracker.status).toBe('completed');
    expect(tracker.agentState).toBe('awaiting_user_input');
    expect(tracker.events.map((e) => e.id)).toEqual([4, 6, 7]);
    expect(tracker.ended).toBe(true);
  });

  it('follows tool results through their call, and ends in error', () => {
    const tracker = track(0, [
      state(1, 'running', 0),
      agent(2, 0, 'tool_call'),
      agent(3, 2, 'tool_result'),
      state(4, 'error', 0),
    ]);
    expect(tracker.status).toBe('error');
    expect(tracker.events.map((e) => e.id)).toEqual([1, 2, 3, 4]);
  });

  it('answers at a confirmation request and runs again once the user answered', () => {
    const tracker = track(0, [
      state(1, 'running', 0),
      agent(2, 0, 'tool_call'),
      state(3, 'awaiting_user_confirmation', 0),
    ]);
    expect(tracker.status).toBe('awaiting_user_confirmation');
    expect(tracker.answered).toBe(true);
    expect(tracker.ended).toBe(false);
    tracker.add(user(4));
    tracker.add(state(5, 'user_confirmed', 4));
    tracker.add(agent(6, 2, 'tool_result'));
    expect(tracker.status).toBe('running');
    tracker.add(state(7, 'finished', 0));
    expect(tracker.status).toBe('completed');
  });

  it("ends a confirmation's own turn at its state change", () => {
    const tracker = track(4, [user(4), state(5, 'user_confirmed', 4), agent(6, 2, 'tool_result')]);
    expect(tracker.status).toBe('completed');
    expect(tracker.agentState).toBe('user_confirmed');
    expect(tracker.events.map((e) => e.id)).toEqual([5]);
  });

  describe('after a rewind (PROTOCOL.md "Branching")', () => {
    it('is undone, for good, by a rewind to before its message', () => {
      const tracker = track(3, [
        state(4, 'running', 3),
        agent(5, 3),
        state(6, 'awaiting_user_input', 3),
        rewind(7, 2),
      ]);
      expect(tracker.status).toBe('undone');
      expect(tracker.ended).toBe(true);
      tracker.add(agent(8, 3));
      expect(tracker.status).toBe('undone');
    });

    it('starts afresh after a regenerate (a rewind to its message), and completes with the new answer', () => {
      const tracker = track(3, [agent(4, 3), state(5, 'awaiting_user_input', 3), rewind(6, 3)]);
      expect(tracker.status).toBe('pending');
      expect(tracker.events).toEqual([]);
      tracker.add(state(7, 'running', 3));
      tracker.add(agent(8, 3));
      tracker.add(state(9, 'awaiting_user_input', 3));
      expect(tracker.status).toBe('completed');
      expect(tracker.events.map((event) => event.id)).toEqual([7, 8, 9]);
    });

    it('skips events read back undone', () => {
      const undone = { ...agent(4, 3), undone_by: 6 };
      const tracker = track(3, [undone, rewind(6, 3), agent(7, 3)]);
      expect(tracker.events.map((event) => event.id)).toEqual([7]);
    });
  });
});
