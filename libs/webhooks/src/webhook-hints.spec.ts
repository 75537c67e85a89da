import type { ConversationStore, NewConversation } from '@cs/core';
import { describe, expect, it } from 'vitest';
import { hintWebhookWrites } from './webhook-hints.js';

/** A store whose writes resolve at once, and whose `setStatus` fails. */
const store = {
  createConversation: (input: NewConversation) =>
    Promise.resolve({ conversation: { id: input.id }, created: true }),
  deleteConversation: () => Promise.resolve(true),
  setStatus: () => Promise.reject(new Error('connection lost')),
  resetRunningStatuses: () => Promise.resolve([]),
  append: () => Promise.resolve([]),
  getConversation: () => Promise.resolve(null),
} as unknown as ConversationStore;

describe(hintWebhookWrites.name, () => {
  it('names the conversation each write went to, also when it failed, and none for a reset', async () => {
    const hints: (string | undefined)[] = [];
    const hinted = hintWebhookWrites(store, (conversationId) => hints.push(conversationId));

    await hinted.createConversation({ id: 'c-new' } as NewConversation);
    await hinted.append('t', 'c-append', []);
    await expect(hinted.setStatus('t', 'c-status', 'RUNNING')).rejects.toThrow('connection lost');
    await hinted.deleteConversation('t', 'c-deleted');
    await hinted.resetRunningStatuses();
    // Not a write that may enqueue.
    await hinted.getConversation('t', 'c-read');

    expect(hints).toEqual(['c-new', 'c-append', 'c-status', 'c-deleted', undefined]);
  });

  it('hints only the writes it is given', async () => {
    const hints: (string | undefined)[] = [];
    const hinted = hintWebhookWrites(store, (conversationId) => hints.push(conversationId), [
      'deleteConversation',
    ]);
    await hinted.append('t', 'c-append', []);
    await hinted.deleteConversation('t', 'c-deleted');
    expect(hints).toEqual(['c-deleted']);
  });
});
