/**
 * Which store writes may have enqueued webhook deliveries (the outbox's
 * triggers decide for sure): a dispatcher in the same process is woken after
 * them, so that a delivery leaves within milliseconds instead of at the next
 * poll.
 */
import type { ConversationStore, NewConversation } from '@cs/core';

export type WebhookWrite =
  'createConversation' | 'deleteConversation' | 'setStatus' | 'resetRunningStatuses' | 'append';

/** Every write that may enqueue; a gateway leaves out `append` (its user messages never do). */
export const WEBHOOK_WRITES: readonly WebhookWrite[] = [
  'createConversation',
  'deleteConversation',
  'setStatus',
  'resetRunningStatuses',
  'append',
];

/**
 * The store, calling `written` after each write of `writes` (also when it
 * failed) with the conversation written to, or none when the write is not of
 * one conversation (the reset of every running one).
 */
export function hintWebhookWrites(
  store: ConversationStore,
  written: (conversationId?: string) => void,
  writes: readonly WebhookWrite[] = WEBHOOK_WRITES,
): ConversationStore {
  const hinted = new Set<string | symbol>(writes);
  return new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver) as unknown;
      if (typeof value !== 'function') return value;
      const method = (value as (...args: unknown[]) => unknown).bind(target);
      if (!hinted.has(property)) return method;
      return async (...args: unknown[]) => {
        try {
          return await method(...args);
        } finally {
          written(writtenConversation(property as WebhookWrite, args));
        }
      };
    },
  });
}

/** The conversation a write of `WEBHOOK_WRITES` goes to, from its arguments. */
function writtenConversation(write: WebhookWrite, args: unknown[]): string | undefined {
  switch (write) {
    case 'createConversation':
      return (args[0] as NewConversation).id;
    case 'resetRunningStatuses':
      return undefined;
    // (tenantId, conversationId, …)
    case 'deleteConversation':
    case 'setStatus':
    case 'append':
      return args[1] as string;
  }
}

/**
 * The Redis channel on which gateways tell workers that deliveries may wait
 * (a hint, classic pub/sub: rare, and lost ones only delay to the next poll);
 * a message is the conversation written to, or empty when not one.
 */
export function webhookWakeChannel(keyPrefix: string): string {
  return `${keyPrefix}:webhooks:wake`;
}
