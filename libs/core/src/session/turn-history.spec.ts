import { describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import type { ConversationRef } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import { RecentEvents, TurnHistory } from './turn-history.js';

const at = '2026-01-01T00:00:00.000Z';
const user = (id: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'user',
  action: 'message',
  args: { content: `message ${id}` },
  message: `message ${id}`,
});
const agent = (id: number, cause: number, action: string): StoredEvent => ({
  id,
  timestamp: at,
  source: 'agent',
  action,
  args: {},
  message: '',
  cause,
});
const result = (id: number, cause: number): StoredEvent => ({
  id,
  timestamp: at,
  source: 'environment',
  observation: 'tool_result',
  content: 'ok',
  extras: {},
  message: 'ok',
  cause,
});

/** A store that holds `events` (ids from 0, in order) and only reads them. */
function storeOf(events: StoredEvent[]): ConversationStore {
  return {
    readEvents: (_tenant: string, _conversation: string, range: { fromId: number; toId: number }) =>
      Promise.resolve(events.filter((e) => e.id >= range.fromId && e.id <= range.toId)),
  } as unknown as ConversationStore;
}

describe('TurnHistory', () => {
  // m1 (1) runs; m2 (2) and m3 (5) are queued behind it. m1's turn stores a call (3) and
  // its result (4) after m2, then its answer (8); the events 6 and 7 hang from m3.
  const events = [
    user(0),
    user(1),
    user(2),
    agent(3, 1, 'tool_call'),
    result(4, 3),
    user(5),
    agent(6, 5, 'tool_call'), // caused by the queued m3: m2's turn must not see it
    result(7, 6),
    agent(8, 1, 'message'),
  ];

  it("shows a queued message's turn the earlier turn's late events with their results, and nothing of a message queued behind it", async () => {
    const history = new TurnHistory(
      storeOf(events),
      { tenantId: 't', userId: 'u', conversationId: 'c' } as ConversationRef,
      events[2]!,
      new Set(),
      events.length - 1,
      new RecentEvents(),
    );
    const seen = (await history.recent(100)).map((e) => e.id);
    expect(seen).toEqual([0, 1, 2, 3, 4, 8]);
    const ranged: number[] = [];
    for await (const event of history.range(3, 8)) ranged.push(event.id);
    expect(ranged).toEqual([3, 4, 8]);
  });
});
