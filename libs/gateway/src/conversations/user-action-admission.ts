/**
 * What is decided about a user action before it is stored: an answer to a
 * confirmation that none awaits is refused at the door, and which stored
 * event an idempotent repeat refers to (one the rate limit then does not
 * count).
 */
import {
  BadRequestError,
  ConflictError,
  NotFoundError,
  userActionDraft,
  type AppendedEvent,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
} from '@cs/core';
import { isSameEvent, type UserAction } from '@cs/protocol';

/**
 * An answer to a confirmation needs one pending. Read fresh: a socket's
 * record is as old as its handshake. (Whether a message is refused under the
 * `reject` strategy is decided by the append, under the row lock, from the
 * strategy as it is then: `AppendOptions.defaultMultitaskStrategy`.)
 */
export async function checkConfirmationAnswer(
  store: ConversationStore,
  conversation: ConversationRecord,
  action: UserAction,
): Promise<void> {
  const answer =
    action.action === 'change_agent_state' &&
    (action.args.agent_state === 'user_confirmed' || action.args.agent_state === 'user_rejected');
  if (!answer) return;
  const current = await store.getConversation(conversation.tenantId, conversation.id);
  if (!current || current.incarnation !== conversation.incarnation) throw new NotFoundError();
  if (current.agentState !== 'awaiting_user_confirmation') {
    throw new BadRequestError('no tool call awaits confirmation', 'args.agent_state');
  }
}

/** The stored event a repeated idempotency key refers to; `CONFLICT` when its content differs. */
export async function findRepeat(
  store: ConversationStore,
  ref: ConversationRef,
  action: UserAction,
  idempotencyKey: string | undefined,
): Promise<AppendedEvent | null> {
  const draft = userActionDraft(action, idempotencyKey);
  if (draft.clientEventId === undefined) return null;
  const stored = await store.findEventByClientEventId(
    ref.tenantId,
    ref.conversationId,
    draft.clientEventId,
  );
  if (!stored) return null;
  if (!isSameEvent({ source: stored.source, body: stored }, draft)) {
    throw new ConflictError('this idempotency key was used for another action');
  }
  return { event: stored, duplicate: true };
}
