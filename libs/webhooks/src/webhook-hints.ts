/**
 * Which store writes may have enqueued webhook deliveries (the outbox's
 * triggers decide for sure): a dispatcher in the same process is woken after
 * them, so that a delivery leaves within milliseconds instead of at the next
 * poll.
 */
import type { ConversationStore } from '@cs/core';

const WRITES = new Set<string | symbol>([
  'createConversation',
  'deleteConversation',
  'setStatus',
  'resetRunningStatuses',
  'append',
]);

/** The store, calling `written` after each write that may enqueue (also when it failed). */
export function hintWebhookWrites(
  store: ConversationStore,
  written: () => void,
): ConversationStore {
  return new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver) as unknown;
      if (typeof value !== 'function') return value;
      const method = (value as (...args: unknown[]) => unknown).bind(target);
      if (!WRITES.has(property)) return method;
      return async (...args: unknown[]) => {
        try {
          return await method(...args);
        } finally {
          written();
        }
      };
    },
  });
}
