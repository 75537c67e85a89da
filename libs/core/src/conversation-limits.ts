/**
 * The limits on running conversations, defined once for the standalone
 * manager, the cluster's gateways and its hosts: the two that end a
 * conversation nobody asked to stop, `IDLE_TIMEOUT_MS` (no client attached,
 * its agent not running, no activity for that long) and
 * `MAX_CONCURRENT_CONVERSATIONS` under `evict_oldest`; and when, under
 * `reject`, a user's slot is taken before anything is stored (docs/protocol.md).
 */
import { StatusId, type ConcurrencyPolicy, type StatusUpdate } from '@cs/protocol';

/** The `extras.reason` and status id of a conversation evicted by `evict_oldest`. */
export const TOO_MANY_CONVERSATIONS = StatusId.TooManyConversations;

/** The status update an evicted conversation's room receives. */
export const TOO_MANY_CONVERSATIONS_NOTICE: Readonly<StatusUpdate> = Object.freeze({
  status_update: true,
  type: 'error',
  id: TOO_MANY_CONVERSATIONS,
  message:
    'This conversation was stopped because too many conversations were running; send a message to resume it.',
});

/**
 * Whether a conversation last active at `lastActivity` has been idle for
 * `IDLE_TIMEOUT_MS` at `now` (a conversation mid-turn or with a client
 * attached is never closed; that is for the caller to check).
 */
export function isIdleSince(lastActivity: number, now: number, idleTimeoutMs: number): boolean {
  return now - lastActivity >= idleTimeoutMs;
}

/** The user and conversation a slot is taken for (the conversation may not be stored yet). */
export interface SlotOwner {
  tenantId: string;
  userId: string;
  conversationId: string;
}

/** A user's slot taken for a conversation before what will start it is stored. */
export interface SlotClaim {
  /** False when the conversation held the slot already: nothing to give back then. */
  readonly taken: boolean;
  /**
   * Gives the slot back when what was to start the conversation was not
   * stored or did not start it; a no-op once the conversation started with it.
   */
  release(): Promise<void>;
}

/** The claim of a conversation that holds its slot already. */
export const HELD_SLOT: SlotClaim = Object.freeze({
  taken: false,
  release: () => Promise.resolve(),
});

/**
 * Whether a write that will start a conversation (a message to one not known
 * to run, a create with `initial_user_msg`) takes its user's slot before it is
 * stored. Under `reject` it must: a refusal stores nothing (docs/protocol.md), so
 * the refusal comes first. Under `evict_oldest` nothing is refused: the start
 * follows the store, so that nobody is evicted for a write that then fails.
 */
export function claimsSlotBeforeStoring(
  policy: ConcurrencyPolicy,
  startsConversation: boolean,
): boolean {
  return policy === 'reject' && startsConversation;
}

/**
 * Runs `write` (store, then start) holding `claim`: if it fails, the slot goes
 * back, so that no slot stays with a conversation that did not start.
 */
export async function withSlotClaim<T>(
  claim: SlotClaim | null,
  write: () => Promise<T>,
): Promise<T> {
  try {
    return await write();
  } catch (error) {
    await claim?.release();
    throw error;
  }
}
