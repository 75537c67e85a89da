import type { EventBody, UserAction } from '@cs/protocol';
import type { ConversationRef, EventDraft } from './conversation.js';
import type { SendOptions } from './conversation-manager.js';
import { AgentBusyError } from './errors.js';
import type { AppendedEvent, ConversationStore } from './ports/conversation-store.port.js';

/**
 * The stored form of a user action. Every manager builds it here, so that an
 * idempotent repeat compares equal whichever door or process it came through.
 */
export function userActionDraft(action: UserAction, idempotencyKey?: string): EventDraft {
  const body: EventBody =
    action.action === 'message'
      ? { action: 'message', args: action.args, message: action.args.content }
      : { action: 'change_agent_state', args: action.args, message: '' };
  const clientEventId = idempotencyKey ?? action.client_event_id;
  return { source: 'user', body, ...(clientEventId === undefined ? {} : { clientEventId }) };
}

/**
 * Stores a user action as every manager does. Refused under `reject` for an
 * earlier message still to answer (`AgentBusyError`), it calls `ensureRunning`
 * first, so that something answers that message.
 */
export async function storeUserAction(
  store: ConversationStore,
  ref: ConversationRef,
  action: UserAction,
  idempotencyKey: string | undefined,
  options: SendOptions,
  ensureRunning: () => Promise<unknown>,
): Promise<AppendedEvent> {
  let appended: AppendedEvent | undefined;
  try {
    [appended] = await store.append(
      ref.tenantId,
      ref.conversationId,
      [userActionDraft(action, idempotencyKey)],
      { incarnation: ref.incarnation, ...(options.refuseIfBusy ? { refuseIfBusy: true } : {}) },
    );
  } catch (error) {
    if (error instanceof AgentBusyError) await ensureRunning().catch(() => undefined);
    throw error;
  }
  if (!appended) throw new Error('the store appended nothing');
  return appended;
}
