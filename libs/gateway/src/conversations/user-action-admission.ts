/**
 * What is decided about a user action before it is stored: what the
 * conversation's agent state refuses at the door, and which stored event an
 * idempotent repeat refers to (one the rate limit then does not count).
 */
import {
  AgentBusyError,
  isBusyState,
  BadRequestError,
  ConflictError,
  NotFoundError,
  userActionDraft,
  type AppendedEvent,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
} from '@cs/core';
import { isSameEvent, type MultitaskStrategy, type UserAction } from '@cs/protocol';

/**
 * An answer to a confirmation needs one pending; under the `reject` strategy
 * a message while a turn runs is refused (and stored nowhere). Read fresh: a
 * socket's record is as old as its handshake.
 */
export async function checkAgentBusy(
  store: ConversationStore,
  defaultStrategy: MultitaskStrategy,
  conversation: ConversationRecord,
  action: UserAction,
): Promise<void> {
  const answer =
    action.action === 'change_agent_state' &&
    (action.args.agent_state === 'user_confirmed' || action.args.agent_state === 'user_rejected');
  const mayReject =
    action.action === 'message' &&
    (conversation.settings.multitaskStrategy ?? defaultStrategy) === 'reject';
  if (!answer && !mayReject && defaultStrategy !== 'reject') return;
  if (!answer && action.action !== 'message') return;
  const current = await store.getConversation(conversation.tenantId, conversation.id);
  if (!current || current.incarnation !== conversation.incarnation) throw new NotFoundError();
  if (answer) {
    if (current.agentState !== 'awaiting_user_confirmation') {
      throw new BadRequestError('no tool call awaits confirmation', 'args.agent_state');
    }
    return;
  }
  const strategy = current.settings.multitaskStrategy ?? defaultStrategy;
  // The cheap refusal; the append decides for good (`refusesWhenBusy`).
  if (strategy === 'reject' && isBusyState(current.agentState)) throw new AgentBusyError();
}

/**
 * Whether the action is a message to a conversation under `reject`: its
 * append is refused while the agent is busy (decided under the row lock, so
 * that of messages sent at the same moment only one is taken).
 */
export function refusesWhenBusy(
  defaultStrategy: MultitaskStrategy,
  conversation: ConversationRecord,
  action: UserAction,
): boolean {
  return (
    action.action === 'message' &&
    (conversation.settings.multitaskStrategy ?? defaultStrategy) === 'reject'
  );
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
