import { describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { RecentEvents } from './turn-history.js';
import { UserEventQueue, type WorkContext } from './user-event-queue.js';

const at = '2026-12-01T12:00:00.000Z';
const message = (id: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'user',
  action: 'message',
  args: { content: `m${id}` },
  message: `m${id}`,
});
const control = (id: number, agentState: string): StoredEvent => ({
  id,
  timestamp: at,
  source: 'user',
  action: 'change_agent_state',
  args: { agent_state: agentState },
  message: '',
});
const stateChange = (id: number, agentState: string, cause: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'environment',
  cause,
  observation: 'agent_state_changed',
  content: '',
  extras: { agent_state: agentState },
  message: '',
});

const idle: WorkContext = { paused: false, suspendedTrigger: null, loadingEventId: 0 };

function queueOf(events: StoredEvent[], startAfter = -1): UserEventQueue {
  const queue = new UserEventQueue(new RecentEvents());
  queue.startAfter(startAfter);
  expect(queue.accept(events)).toBe(true);
  return queue;
}

describe(UserEventQueue.name, () => {
  it('takes events in id order, skips known ones and stops at a gap', () => {
    const queue = new UserEventQueue(new RecentEvents());
    expect(queue.accept([message(0), message(1)])).toBe(true);
    expect(queue.accept([message(1)])).toBe(true);
    expect(queue.lastEventId).toBe(1);
    expect(queue.accept([message(3)])).toBe(false);
    expect(queue.lastEventId).toBe(1);
  });

  it('hands out controls before messages, and messages oldest first', () => {
    const queue = queueOf([message(0), message(1), control(2, 'paused')]);
    expect(queue.nextWork(idle)).toMatchObject({ kind: 'control', target: 'paused' });
    queue.markDone(2);
    expect(queue.nextWork(idle)).toMatchObject({ kind: 'message', event: { id: 0 } });
    queue.markDone(0);
    expect(queue.nextWork(idle)).toMatchObject({ kind: 'message', event: { id: 1 } });
  });

  it('holds messages back while paused, but not controls', () => {
    const queue = queueOf([message(0)]);
    expect(queue.nextWork({ ...idle, paused: true })).toBeNull();
    queue.accept([control(1, 'running')]);
    expect(queue.nextWork({ ...idle, paused: true })).toMatchObject({ target: 'running' });
  });

  it('skips a stop stored before this run began, and a malformed control', () => {
    const queue = queueOf([control(0, 'stopped'), control(1, 'sideways'), message(2)]);
    expect(queue.nextWork({ ...idle, loadingEventId: 3 })).toMatchObject({
      kind: 'message',
      event: { id: 2 },
    });
  });

  it('leaves the message of a turn awaiting confirmation alone, and answers the next one', () => {
    const queue = queueOf([message(0)]);
    expect(queue.nextWork({ ...idle, suspendedTrigger: 0 })).toBeNull();
    queue.accept([message(1)]);
    expect(queue.nextWork({ ...idle, suspendedTrigger: 0 })).toMatchObject({
      event: { id: 1 },
    });
  });

  it('takes a message as answered when a settled state change names it, not a running one', () => {
    const queue = queueOf([message(0), stateChange(1, 'running', 0)]);
    expect(queue.nextWork(idle)).toMatchObject({ event: { id: 0 } });
    queue.accept([stateChange(2, 'awaiting_user_input', 0)]);
    expect(queue.nextWork(idle)).toBeNull();
  });

  it('lists the pending user events after a turn for interruption checks', () => {
    const queue = queueOf([message(0), message(1), control(2, 'stopped')]);
    expect(queue.pendingAfter(0).map((e) => e.id)).toEqual([1, 2]);
    queue.markDone(1);
    expect(queue.pendingAfter(0).map((e) => e.id)).toEqual([2]);
  });
});
