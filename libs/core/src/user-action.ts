import type { ConcurrencyPolicy, EventBody, UserAction } from '@cs/protocol';
import type { ConversationRef, EventDraft } from './conversation.js';
import { claimsSlotBeforeStoring, withSlotClaim, type SlotClaim } from './conversation-limits.js';
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

/** How a manager starts the conversation a user action is stored to (see `storeUserAction`). */
export interface UserActionStart {
  policy: ConcurrencyPolicy;
  /** The conversation runs, as far as the manager knows without a round trip. */
  running: boolean;
  /** Takes the user's slot for the conversation (`HELD_SLOT` when it has one), or throws `ConcurrencyLimitError`. */
  claimSlot(): Promise<SlotClaim>;
  ensureRunning(): Promise<unknown>;
  /**
   * What follows the store: publish, wake the agent or start it. `claimed`:
   * a slot was taken for this action, so the conversation is to start.
   */
  deliver(appended: AppendedEvent, claimed: boolean): Promise<void>;
}

/**
 * Stores a user action as every manager does. A message that will start its
 * conversation takes the slot first where the policy says so
 * (`claimsSlotBeforeStoring`): refused, nothing is stored; if the store or
 * the start then fails, the slot goes back. Refused under `reject` for an
 * earlier message still to answer (`AgentBusyError`), it calls `ensureRunning`
 * first, so that something answers that message.
 */
export async function storeUserAction(
  store: ConversationStore,
  ref: ConversationRef,
  action: UserAction,
  idempotencyKey: string | undefined,
  options: SendOptions,
  start: UserActionStart,
): Promise<AppendedEvent> {
  const startsConversation = action.action === 'message' && !start.running;
  const claim = claimsSlotBeforeStoring(start.policy, startsConversation)
    ? await start.claimSlot()
    : null;
  return withSlotClaim(claim, async () => {
    let appended: AppendedEvent | undefined;
    try {
      [appended] = await store.append(
        ref.tenantId,
        ref.conversationId,
        [userActionDraft(action, idempotencyKey)],
        {
          incarnation: ref.incarnation,
          ...(options.defaultMultitaskStrategy === undefined
            ? {}
            : { defaultMultitaskStrategy: options.defaultMultitaskStrategy }),
        },
      );
    } catch (error) {
      if (error instanceof AgentBusyError) await start.ensureRunning().catch(() => undefined);
      throw error;
    }
    if (!appended) throw new Error('the store appended nothing');
    await start.deliver(appended, claim?.taken ?? false);
    return appended;
  });
}
