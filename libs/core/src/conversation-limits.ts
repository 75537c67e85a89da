/**
 * The two limits that end a conversation nobody asked to stop, defined once
 * for the standalone manager and the cluster's hosts: `IDLE_TIMEOUT_MS` (no
 * client attached, its agent not running, no activity for that long) and
 * `MAX_CONCURRENT_CONVERSATIONS` under `evict_oldest` (PROTOCOL.md).
 */
import { StatusId, type StatusUpdate } from '@cs/protocol';

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
