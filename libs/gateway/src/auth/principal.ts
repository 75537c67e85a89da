import { NotFoundError, type ConversationRecord } from '@cs/core';

/** The authenticated caller: a user of a tenant, maybe an admin of it. */
export interface Principal {
  tenantId: string;
  userId: string;
  roles: readonly string[];
  isAdmin: boolean;
  /**
   * When the token's access ends (ms since the epoch): connections close then.
   * Its `exp`; for a token already past it when verified (within the clock
   * tolerance), the end of the tolerance.
   */
  expiresAt: number;
}

/**
 * Another tenant's conversation, or another user's for a non-admin, does not
 * exist for the caller: NOT_FOUND, never FORBIDDEN (docs/protocol.md).
 */
export function assertVisible(
  principal: Principal,
  conversation: ConversationRecord | null,
): asserts conversation is ConversationRecord {
  if (
    !conversation ||
    conversation.tenantId !== principal.tenantId ||
    (!principal.isAdmin && conversation.userId !== principal.userId)
  ) {
    throw new NotFoundError();
  }
}
