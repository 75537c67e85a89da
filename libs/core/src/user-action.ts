import type { EventBody, UserAction } from '@cs/protocol';
import type { EventDraft } from './conversation.js';

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
