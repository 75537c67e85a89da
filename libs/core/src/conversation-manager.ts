import type { ConversationStatus, MultitaskStrategy, UserAction } from '@cs/protocol';
import type { ConversationRef } from './conversation.js';
import type { SlotClaim, SlotOwner } from './conversation-limits.js';
import type { AppendedEvent } from './ports/conversation-store.port.js';

/** One client connection attached to a conversation's room. */
export interface Attachment extends ConversationRef {
  connectionId: string;
}

/** How a user action is stored (see `AppendOptions`). */
export interface SendOptions {
  /**
   * For a message: the deployment's `MULTITASK_STRATEGY`; under `reject` (the
   * conversation's, read when it is stored) it is refused with
   * `AgentBusyError` while the agent is busy (`AppendOptions`).
   */
  defaultMultitaskStrategy?: MultitaskStrategy;
  /**
   * The conversation's status as the caller read it just now (not a socket's,
   * as old as its handshake). RUNNING spares the cluster the slot's check
   * before the store (`claimsSlotBeforeStoring`).
   */
  status?: ConversationStatus;
}

/**
 * Decides where and whether a conversation's agent runs. The standalone
 * manager runs sessions in this process; the clustered one leases them to
 * workers. Callers have already checked that `ref` exists and is visible to
 * the caller; `ref.userId` is the conversation's owner, whose limit applies.
 */
export interface ConversationManager {
  /** Records that a client joined the conversation's room. */
  attach(attachment: Attachment): Promise<void>;
  /** Records that a client left; unknown ids are ignored. */
  detach(connectionId: string): Promise<void>;
  /** Number of clients attached to the conversation (across the deployment). */
  connectionCount(conversationId: string): Promise<number>;
  /**
   * Starts the conversation's agent unless it runs already (a running session
   * is reused). Applies the owner's concurrency limit: evicts the least
   * recently active conversation, or throws `ConcurrencyLimitError`.
   */
  ensureRunning(ref: ConversationRef): Promise<ConversationStatus>;
  /**
   * Takes the owner's slot for a conversation (stored or about to be) that
   * what the caller is about to store will start, where the policy takes it
   * before storing (`claimsSlotBeforeStoring`, under `reject`): throws
   * `ConcurrencyLimitError` when none is free, so that nothing is stored.
   * Null under `evict_oldest`; `HELD_SLOT` when the conversation holds one.
   * The caller starts the conversation, or releases the claim.
   */
  claimSlot(owner: SlotOwner): Promise<SlotClaim | null>;
  /**
   * Stores a user action (idempotent by `client_event_id` / `idempotencyKey`)
   * and hands it to the running agent, starting the agent when a message
   * arrives for a stopped conversation. Under `reject` a message it cannot
   * start the conversation for is refused (`ConcurrencyLimitError`) before
   * anything is stored.
   */
  sendUserAction(
    ref: ConversationRef,
    action: UserAction,
    idempotencyKey?: string,
    options?: SendOptions,
  ): Promise<AppendedEvent>;
  /** Stops the conversation's agent (no-op when not running). */
  stop(ref: ConversationRef): Promise<ConversationStatus>;
  /**
   * A PATCH stored new settings (`confirmation_mode`, `multitask_strategy`):
   * the running agent, wherever it runs, reads them again before its next
   * decision that uses them. Best effort, like a wake-up: nothing is stored.
   */
  settingsChanged(ref: ConversationRef): Promise<void>;
  /** The live status: STOPPED / STARTING / RUNNING / ERROR. */
  status(ref: ConversationRef): Promise<ConversationStatus>;
  /** Ids of the running (or starting) conversations of a user. */
  listRunning(tenantId: string, userId: string): Promise<string[]>;
  /** Where the conversation runs, for admins (`runtime` in the state response). */
  runtime(ref: ConversationRef): Promise<{ workerId: string; leaseEpoch: number } | null>;
  /** Stops every session, checkpointing each; resolves when all are closed. */
  shutdown(): Promise<void>;
}
