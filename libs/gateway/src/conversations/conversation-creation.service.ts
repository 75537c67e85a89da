import { Inject, Injectable } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import {
  BadRequestError,
  ConcurrencyLimitError,
  ConflictError,
  DomainError,
  RateLimitedError,
  refOf,
  userActionDraft,
  type AgentFactory,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
  type RateLimitReservation,
  type SlotClaim,
  type UserActionRateLimiter,
} from '@cs/core';
import { isAction, type ConversationStatus, type CreateConversationBody } from '@cs/protocol';
import { randomUUID } from 'node:crypto';
import { ServiceMetrics } from '@cs/observability';
import type { Principal } from '../auth/principal.js';
import {
  AGENT_FACTORY,
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  USER_ACTION_RATE_LIMITER,
} from '../tokens.js';
import { NO_REPLAY, parseReplay, replayDrafts } from './conversation-replay.js';
import { settingsOf } from './conversation-settings.js';
import { countStoredUserActions } from './user-action-delivery.service.js';

/** What a create answers, and whether it made the conversation (201) or found it (200). */
export interface CreatedConversation {
  created: boolean;
  conversation_id: string;
  conversation_status: ConversationStatus;
}

/** The app name of conversations created through this API. */
export const DEFAULT_APP_NAME = 'default';
const INITIAL_MESSAGE_KEY = 'initial_user_msg';

/**
 * `POST /conversations`: makes a conversation (agent, settings, replayed history, first message),
 * whole or not at all, or finds the one a repeat made; starts its agent for a first message.
 */
@Injectable()
export class ConversationCreation {
  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(CONVERSATION_STORE) private readonly store: ConversationStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    @Inject(USER_ACTION_RATE_LIMITER) private readonly rateLimiter: UserActionRateLimiter,
    @Inject(AGENT_FACTORY) private readonly agents: AgentFactory,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
  ) {}

  async create(principal: Principal, body: CreateConversationBody): Promise<CreatedConversation> {
    const agentName = body.agent ?? this.config.agent.default;
    if (!this.agents.has(agentName))
      throw new BadRequestError(`unknown agent ${agentName}`, 'agent');
    const settings = settingsOf(body, this.config.limits);
    const agentConfig = body.agent_config ?? {};
    this.agents.validateConfig?.(agentName, agentConfig);
    const replay = body.replay_json === undefined ? NO_REPLAY : parseReplay(body.replay_json);
    const drafts = replayDrafts(replay);
    if (body.initial_user_msg !== undefined) {
      drafts.push(
        userActionDraft(
          {
            action: 'message',
            args: { content: body.initial_user_msg, image_urls: [], file_urls: [] },
          },
          INITIAL_MESSAGE_KEY,
        ),
      );
    }
    const id = body.conversation_id ?? randomUUID();
    // The create, its initial message and each replayed event are user actions.
    const actions = 1 + replay.events.length + (body.initial_user_msg === undefined ? 0 : 1);
    const reservation = await this.rateLimiter.reserve(
      principal.tenantId,
      principal.userId,
      actions,
    );
    if (!reservation.reserved) {
      // A repeat of the caller's own create stores nothing: it is not refused.
      const existing = await this.store.getConversation(principal.tenantId, id);
      if (!existing || existing.userId !== principal.userId) {
        throw RateLimitedError.forActions(reservation.retryAfterMs);
      }
      return this.created(existing, false, body);
    }
    let result: { conversation: ConversationRecord; created: boolean };
    let claim: SlotClaim | null = null;
    try {
      // The first message starts the conversation: under `reject` its slot comes
      // first, so that a refusal (CONCURRENCY_LIMIT_REACHED) stores nothing.
      if (body.initial_user_msg !== undefined) claim = await this.claimFirstStart(principal, id);
      // The row, the replay and the first message: all of it is stored, or none.
      result = await this.store.createConversation(
        {
          id,
          tenantId: principal.tenantId,
          userId: principal.userId,
          appName: DEFAULT_APP_NAME,
          title: body.title ?? '',
          metadata: body.metadata ?? {},
          agent: { name: agentName, config: agentConfig },
          instructions: body.conversation_instructions ?? null,
          settings,
        },
        drafts,
      );
    } catch (error) {
      await Promise.all([reservation.cancel(), claim?.release()]);
      throw error;
    }
    if (!result.created) await reservation.cancel();
    try {
      const answer = await this.created(result.conversation, result.created, body);
      if (result.created) countStoredUserActions(this.metrics, actions);
      return answer;
    } catch (error) {
      if (result.created) await this.undoFailedCreate(result.conversation, error, reservation);
      throw error;
    } finally {
      // Given back unless the conversation started with it (a repeat may start nothing).
      await claim?.release();
    }
  }

  /**
   * A new conversation whose first message could not be handed on (Redis
   * away, or a failure: 503 or 500) goes again. The client heard that the
   * create failed and may send it again: nothing of it may stay, to be listed
   * twice or to start when a socket or a repeat asks. A refusal the contract
   * names (`CONCURRENCY_LIMIT_REACHED`) keeps it, and a repeat starts it.
   */
  private async undoFailedCreate(
    conversation: ConversationRecord,
    error: unknown,
    reservation: RateLimitReservation,
  ): Promise<void> {
    if (error instanceof DomainError && error.code !== 'UNAVAILABLE') return;
    // Best effort: with Postgres away too, it stays, unstarted, as a refused start leaves it.
    await Promise.all([
      this.store.deleteConversation(conversation.tenantId, conversation.id).catch(() => false),
      reservation.cancel().catch(() => undefined),
    ]);
  }

  /**
   * The slot a create's first message will start its conversation with. At
   * the limit, an id stored already is not refused here: a repeat of the
   * caller's own create (or someone else's id, 409) stores nothing, and
   * `created` decides whether it starts.
   */
  private async claimFirstStart(principal: Principal, id: string): Promise<SlotClaim | null> {
    const owner = { tenantId: principal.tenantId, userId: principal.userId, conversationId: id };
    try {
      return await this.manager.claimSlot(owner);
    } catch (error) {
      if (!(error instanceof ConcurrencyLimitError)) throw error;
      if (await this.store.getConversation(principal.tenantId, id)) return null;
      throw error;
    }
  }

  /**
   * A repeated create is the same request again: one with another first
   * message (or one where there was none) would drop it, and might start the
   * agent for nothing, so it is `CONFLICT`, as a reused idempotency key.
   */
  private async assertSameFirstMessage(
    ref: ConversationRef,
    body: CreateConversationBody,
  ): Promise<void> {
    const stored = await this.store.findEventByClientEventId(
      ref.tenantId,
      ref.conversationId,
      INITIAL_MESSAGE_KEY,
    );
    const content =
      stored && isAction(stored) && stored.action === 'message'
        ? stored.args['content']
        : undefined;
    if (content !== body.initial_user_msg) {
      throw new ConflictError('this conversation_id was created with another initial_user_msg');
    }
  }

  /**
   * Starts the agent when the create carried a first message (again on a
   * repeat whose agent never started: the first attempt's start was refused).
   */
  private async created(
    conversation: ConversationRecord,
    created: boolean,
    body: CreateConversationBody,
  ): Promise<CreatedConversation> {
    const ref = refOf(conversation);
    if (!created) await this.assertSameFirstMessage(ref, body);
    if (body.initial_user_msg !== undefined && (created || conversation.agentState === null)) {
      await this.manager.ensureRunning(ref);
    }
    return {
      created,
      conversation_id: conversation.id,
      conversation_status: await this.manager.status(ref),
    };
  }
}
