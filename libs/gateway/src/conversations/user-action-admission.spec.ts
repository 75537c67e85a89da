import {
  BadRequestError,
  ConflictError,
  DEFAULT_SETTINGS,
  EMPTY_METRICS,
  NotFoundError,
  refOf,
  type ConversationRecord,
  type ConversationStore,
} from '@cs/core';
import type { AgentState, StoredEvent, UserAction } from '@cs/protocol';
import { describe, expect, it } from 'vitest';
import { checkConfirmationAnswer, findRepeat } from './user-action-admission.js';

const record = (agentState: AgentState | null, incarnation = 'i1'): ConversationRecord => ({
  id: 'c1',
  tenantId: 't1',
  userId: 'u1',
  appName: 'default',
  title: '',
  metadata: {},
  agent: { name: 'echo', config: {} },
  instructions: null,
  status: 'RUNNING',
  agentState,
  lastEventId: 3,
  leaseEpoch: 1,
  leaseOwner: null,
  incarnation,
  metrics: { ...EMPTY_METRICS },
  answeredThrough: -1,
  turnCost: null,
  settings: { ...DEFAULT_SETTINGS },
  createdAt: new Date(0),
  updatedAt: new Date(0),
});

/** Only what the checks read: the conversation as stored now, and events by key. */
const storeWith = (
  current: ConversationRecord | null,
  events: Record<string, StoredEvent> = {},
): ConversationStore =>
  ({
    getConversation: () => Promise.resolve(current),
    findEventByClientEventId: (_t: string, _c: string, key: string) =>
      Promise.resolve(events[key] ?? null),
  }) as unknown as ConversationStore;

const message = (content: string, client_event_id?: string): UserAction => ({
  action: 'message',
  args: { content, image_urls: [], file_urls: [] },
  ...(client_event_id === undefined ? {} : { client_event_id }),
});
const stored: StoredEvent = {
  id: 2,
  timestamp: '2026-12-01T12:00:00.000Z',
  source: 'user',
  action: 'message',
  args: { file_urls: [], content: 'hi', image_urls: [] },
  message: 'hi',
  client_event_id: 'k1',
};
const ref = refOf(record('running'));

describe('findRepeat', () => {
  const store = storeWith(record('running'), { k1: stored });

  it('answers a repeat of the stored action with the stored event, as a duplicate', async () => {
    await expect(findRepeat(store, ref, message('hi', 'k1'), undefined)).resolves.toEqual({
      event: stored,
      duplicate: true,
    });
    await expect(findRepeat(store, ref, message('hi'), 'k1')).resolves.toEqual({
      event: stored,
      duplicate: true,
    });
  });

  it('refuses the key with other content, and finds nothing without a key or a stored event', async () => {
    await expect(findRepeat(store, ref, message('hello', 'k1'), undefined)).rejects.toThrow(
      ConflictError,
    );
    await expect(findRepeat(store, ref, message('hi'), undefined)).resolves.toBeNull();
    await expect(findRepeat(store, ref, message('hi', 'k2'), undefined)).resolves.toBeNull();
  });
});

describe('checkConfirmationAnswer', () => {
  const answer: UserAction = {
    action: 'change_agent_state',
    args: { agent_state: 'user_confirmed' },
  };

  it('lets an answer through only while a tool call awaits confirmation, as stored now', async () => {
    const waiting = record('awaiting_user_confirmation');
    await expect(
      checkConfirmationAnswer(storeWith(waiting), record('running'), answer),
    ).resolves.toBeUndefined();
    const running = record('running');
    await expect(checkConfirmationAnswer(storeWith(running), waiting, answer)).rejects.toThrow(
      BadRequestError,
    );
  });

  it('leaves messages and other state changes to the append', async () => {
    const running = record('running');
    await expect(
      checkConfirmationAnswer(storeWith(null), running, message('x')),
    ).resolves.toBeUndefined();
    await expect(
      checkConfirmationAnswer(storeWith(null), running, {
        action: 'change_agent_state',
        args: { agent_state: 'paused' },
      }),
    ).resolves.toBeUndefined();
  });

  it('reads the conversation fresh: one deleted or recreated since is not found', async () => {
    const old = record('awaiting_user_confirmation', 'i1');
    await expect(
      checkConfirmationAnswer(storeWith(record('awaiting_user_confirmation', 'i2')), old, answer),
    ).rejects.toThrow(NotFoundError);
    await expect(checkConfirmationAnswer(storeWith(null), old, answer)).rejects.toThrow(
      NotFoundError,
    );
  });
});
