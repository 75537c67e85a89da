import { Inject, Injectable, Logger } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import {
  isLiveStatus,
  RateLimitedError,
  refOf,
  type AppendedEvent,
  type ConversationManager,
  type ConversationRecord,
  type ConversationStore,
  type SendOptions,
  type UserActionRateLimiter,
} from '@cs/core';
import type {
  ConversationInfo,
  ConversationStatus,
  PatchConversationBody,
  UserAction,
} from '@cs/protocol';
import { ServiceMetrics } from '@cs/observability';
import { assertVisible, type Principal } from '../auth/principal.js';
import {
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  USER_ACTION_RATE_LIMITER,
} from '../tokens.js';
import { ConversationService } from './conversation.service.js';
import { checkConfirmationAnswer, findRepeat } from './user-action-admission.js';

/**
 * Counts the user actions a request stored (`cs_user_actions_total`) as
 * `RATE_LIMIT_PER_MINUTE` counts them (docs/protocol.md): an action sent over
 * the socket or REST; a create, its `initial_user_msg` and each replayed
 * event. An idempotent repeat or a refused action is none. Called once the
 * request that stored them is answered with success.
 */
export function countStoredUserActions(metrics: ServiceMetrics, count: number): void {
  metrics.userActions.inc(count);
}

/**
 * Hands what a caller does to an existing conversation to its manager: messages, confirmations,
 * start and stop (user actions of `RATE_LIMIT_PER_MINUTE`), a PATCH, a socket's attach.
 */
@Injectable()
export class UserActionDelivery {
  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(CONVERSATION_STORE) private readonly store: ConversationStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    @Inject(USER_ACTION_RATE_LIMITER) private readonly rateLimiter: UserActionRateLimiter,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    private readonly conversations: ConversationService,
  ) {}

  private readonly logger = new Logger(UserActionDelivery.name);

  /** `PATCH /conversations/:id`; a running agent is told of new settings. */
  async update(
    principal: Principal,
    conversationId: string,
    patch: PatchConversationBody,
  ): Promise<ConversationInfo> {
    await this.conversations.find(principal, conversationId);
    const updated = await this.store.updateConversation(principal.tenantId, conversationId, {
      ...(patch.title === undefined ? {} : { title: patch.title }),
      ...(patch.metadata === undefined ? {} : { metadata: patch.metadata }),
      ...(patch.confirmation_mode === undefined
        ? {}
        : { confirmationMode: patch.confirmation_mode }),
      ...(patch.multitask_strategy === undefined
        ? {}
        : { multitaskStrategy: patch.multitask_strategy }),
    });
    assertVisible(principal, updated);
    // Every socket and stream decides by the stored row (the append reads the
    // strategy under its lock); the running agent is told to read it again.
    if (patch.confirmation_mode !== undefined || patch.multitask_strategy !== undefined) {
      await this.manager.settingsChanged(refOf(updated)).catch((error: unknown) => {
        // Stored and answered: the agent reads the settings at its next start.
        this.logger.warn({
          msg: `could not tell the agent of new settings: ${String(error)}`,
          conversation_id: conversationId,
        });
      });
    }
    return this.conversations.info(updated);
  }

  /** `POST …/start`: one user action (it stores the agent's start), as a socket's would be. */
  async start(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    const conversation = await this.conversations.find(principal, conversationId);
    // A start of a running agent stores nothing: not counted, not refused.
    if (isLiveStatus(conversation.status)) {
      return this.manager.ensureRunning(refOf(conversation));
    }
    return this.countedAction(principal, () => this.manager.ensureRunning(refOf(conversation)));
  }

  /** `POST …/stop`: one user action (it stores `stopped`), as `change_agent_state` is. */
  async stop(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    const conversation = await this.conversations.find(principal, conversationId);
    // A stop of a stopped agent stores nothing: not counted, not refused.
    if (conversation.status === 'STOPPED') return this.manager.stop(refOf(conversation));
    return this.countedAction(principal, () => this.manager.stop(refOf(conversation)));
  }

  /**
   * Runs `act` as one user action of `RATE_LIMIT_PER_MINUTE`: refused with
   * `RATE_LIMITED` beyond it, given back when `act` fails.
   */
  private async countedAction<T>(principal: Principal, act: () => Promise<T>): Promise<T> {
    const reservation = await this.rateLimiter.reserve(principal.tenantId, principal.userId);
    if (!reservation.reserved) throw RateLimitedError.forActions(reservation.retryAfterMs);
    try {
      const result = await act();
      countStoredUserActions(this.metrics, 1);
      return result;
    } catch (error) {
      await reservation.cancel();
      throw error;
    }
  }

  /** Stores a user action once (idempotent by key) and hands it to the agent. */
  async sendUserAction(
    principal: Principal,
    conversationId: string,
    action: UserAction,
    idempotencyKey?: string,
  ): Promise<AppendedEvent> {
    const conversation = await this.conversations.find(principal, conversationId);
    return this.sendUserActionToFound(principal, conversation, action, idempotencyKey);
  }

  /** `sendUserAction` to a conversation `find` has just read (a REST wait joins its room between). */
  sendUserActionToFound(
    principal: Principal,
    conversation: ConversationRecord,
    action: UserAction,
    idempotencyKey?: string,
  ): Promise<AppendedEvent> {
    // Read just now: its status tells the manager whether the message may start it.
    return this.deliverUserAction(principal, conversation, action, idempotencyKey, {
      status: conversation.status,
    });
  }

  /**
   * `sendUserAction` to a conversation the caller was found to see (a
   * socket's, checked at its handshake): no read before the append. One
   * deleted since fails the append with `NOT_FOUND`.
   */
  sendUserActionTo(
    principal: Principal,
    conversation: ConversationRecord,
    action: UserAction,
    idempotencyKey?: string,
  ): Promise<AppendedEvent> {
    return this.deliverUserAction(principal, conversation, action, idempotencyKey, {});
  }

  private async deliverUserAction(
    principal: Principal,
    conversation: ConversationRecord,
    action: UserAction,
    idempotencyKey: string | undefined,
    read: Pick<SendOptions, 'status'>,
  ): Promise<AppendedEvent> {
    const ref = refOf(conversation);
    await checkConfirmationAnswer(this.store, conversation, action);
    const reservation = await this.rateLimiter.reserve(principal.tenantId, principal.userId);
    if (!reservation.reserved) {
      // An idempotent repeat stores nothing, so it does not count against the limit.
      const repeat = await findRepeat(this.store, ref, action, idempotencyKey);
      if (repeat) return repeat;
      throw RateLimitedError.forActions(reservation.retryAfterMs);
    }
    try {
      const appended = await this.manager.sendUserAction(ref, action, idempotencyKey, {
        ...read,
        // Under `reject` (the conversation's strategy as stored when the message is,
        // not as `conversation` was read) a message is refused while the agent works;
        // a repeat of one stored already is acknowledged again, busy or not.
        ...(action.action === 'message'
          ? { defaultMultitaskStrategy: this.config.agent.multitaskStrategy }
          : {}),
      });
      if (appended.duplicate) await reservation.cancel();
      else countStoredUserActions(this.metrics, 1);
      return appended;
    } catch (error) {
      await reservation.cancel();
      throw error;
    }
  }

  /** A socket's connection to the conversation: its holder stays while one is attached. */
  attach(connectionId: string, conversation: ConversationRecord): Promise<void> {
    return this.manager.attach({ connectionId, ...refOf(conversation) });
  }

  detach(connectionId: string): Promise<void> {
    return this.manager.detach(connectionId);
  }

  /** A socket's `start=true`: the agent started, not counted (it stores nothing once running). */
  ensureRunning(conversation: ConversationRecord): Promise<ConversationStatus> {
    return this.manager.ensureRunning(refOf(conversation));
  }
}
