import { Inject, Injectable } from '@nestjs/common';
import { z } from 'zod';
import type { AppConfig } from '@cs/config';
import {
  BadRequestError,
  ConflictError,
  RateLimitedError,
  userActionDraft,
  toConversationInfo,
  type AgentFactory,
  type AppendedEvent,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
  type EventDraft,
} from '@cs/core';
import {
  ActionBodySchema,
  EventSourceSchema,
  ObservationBodySchema,
  type ConversationInfo,
  type ConversationPage,
  type ConversationStateResponse,
  type ConversationStatus,
  type CreateConversationBody,
  type ListConversationsQuery,
  type ListEventsQuery,
  type PatchConversationBody,
  type StoredEvent,
  type UserAction,
} from '@cs/protocol';
import { randomUUID } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import { assertVisible, type Principal } from '../auth/principal.js';
import type { UserActionRateLimiter } from '../rate-limit/user-action-rate-limiter.js';
import {
  AGENT_FACTORY,
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  USER_ACTION_RATE_LIMITER,
} from '../tokens.js';

/** The app name of conversations created through this API. */
export const DEFAULT_APP_NAME = 'default';
const MAX_REPLAY_EVENTS = 10_000;
const INITIAL_MESSAGE_KEY = 'initial_user_msg';

const ReplayEventSchema = z.union([
  ActionBodySchema.extend({ source: EventSourceSchema.default('agent') }),
  ObservationBodySchema.extend({ source: EventSourceSchema.default('environment') }),
]);

/**
 * What a caller may do with conversations, whichever door it came through
 * (REST, Socket.IO, SSE): visibility by tenant and user, rate limits, and the
 * hand-off of user actions to the conversation manager.
 */
@Injectable()
export class ConversationService {
  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(CONVERSATION_STORE) private readonly store: ConversationStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    @Inject(USER_ACTION_RATE_LIMITER) private readonly rateLimiter: UserActionRateLimiter,
    @Inject(AGENT_FACTORY) private readonly agents: AgentFactory,
  ) {}

  /** The conversation if the caller may see it; `NOT_FOUND` otherwise. */
  async find(principal: Principal, conversationId: string): Promise<ConversationRecord> {
    const conversation = await this.store.getConversation(principal.tenantId, conversationId);
    assertVisible(principal, conversation);
    return conversation;
  }

  async create(
    principal: Principal,
    body: CreateConversationBody,
  ): Promise<{
    created: boolean;
    conversation_id: string;
    conversation_status: ConversationStatus;
  }> {
    const agentName = body.agent ?? this.config.agent.default;
    if (!this.agents.has(agentName))
      throw new BadRequestError(`unknown agent ${agentName}`, 'agent');
    const replay = body.replay_json === undefined ? [] : parseReplay(body.replay_json);
    const { conversation, created } = await this.store.createConversation({
      id: body.conversation_id ?? randomUUID(),
      tenantId: principal.tenantId,
      userId: principal.userId,
      appName: DEFAULT_APP_NAME,
      title: body.title ?? '',
      metadata: body.metadata ?? {},
      agent: { name: agentName, config: {} },
      instructions: body.conversation_instructions ?? null,
    });
    if (created && replay.length > 0) {
      // The replayed history is answered already: mark it so the agent resumes after it.
      const marker: EventDraft = {
        source: 'environment',
        cause: replay.length - 1,
        body: {
          observation: 'agent_state_changed',
          content: '',
          extras: { agent_state: 'awaiting_user_input', reason: 'replayed' },
          message: '',
        },
      };
      await this.store.append(principal.tenantId, conversation.id, [...replay, marker]);
    }
    const ref = refOf(conversation);
    if (created && body.initial_user_msg !== undefined) {
      await this.sendUserAction(
        principal,
        conversation.id,
        {
          action: 'message',
          args: { content: body.initial_user_msg, image_urls: [], file_urls: [] },
        },
        INITIAL_MESSAGE_KEY,
      );
    }
    return {
      created,
      conversation_id: conversation.id,
      conversation_status: await this.manager.status(ref),
    };
  }

  async list(principal: Principal, query: ListConversationsQuery): Promise<ConversationPage> {
    const everyone = principal.isAdmin && query.all;
    const page = await this.store.listConversations(principal.tenantId, {
      userId: everyone ? undefined : principal.userId,
      limit: query.limit,
      cursor: query.page_id,
    });
    return {
      results: page.items.map((record) => toConversationInfo(record)),
      next_page_id: page.nextCursor,
    };
  }

  async get(principal: Principal, conversationId: string): Promise<ConversationInfo> {
    return toConversationInfo(await this.find(principal, conversationId));
  }

  async update(
    principal: Principal,
    conversationId: string,
    patch: PatchConversationBody,
  ): Promise<ConversationInfo> {
    await this.find(principal, conversationId);
    const updated = await this.store.updateConversation(principal.tenantId, conversationId, patch);
    assertVisible(principal, updated);
    return toConversationInfo(updated);
  }

  async delete(principal: Principal, conversationId: string): Promise<void> {
    const conversation = await this.find(principal, conversationId);
    await this.manager.stop(refOf(conversation));
    await this.store.deleteConversation(principal.tenantId, conversationId);
  }

  async start(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    return this.manager.ensureRunning(refOf(await this.find(principal, conversationId)));
  }

  async stop(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    return this.manager.stop(refOf(await this.find(principal, conversationId)));
  }

  /** Stores a user action once (idempotent by key) and hands it to the agent. */
  async sendUserAction(
    principal: Principal,
    conversationId: string,
    action: UserAction,
    idempotencyKey?: string,
  ): Promise<AppendedEvent> {
    const conversation = await this.find(principal, conversationId);
    return this.sendUserActionTo(principal, conversation, action, idempotencyKey);
  }

  /**
   * `sendUserAction` to a conversation the caller was found to see (a
   * socket's, checked at its handshake): no read before the append. One
   * deleted since fails the append with `NOT_FOUND`.
   */
  async sendUserActionTo(
    principal: Principal,
    conversation: ConversationRecord,
    action: UserAction,
    idempotencyKey?: string,
  ): Promise<AppendedEvent> {
    const ref = refOf(conversation);
    const reservation = await this.rateLimiter.reserve(principal.tenantId, principal.userId);
    if (!reservation) {
      // An idempotent repeat stores nothing, so it does not count against the limit.
      const repeat = await this.findRepeat(ref, action, idempotencyKey);
      if (repeat) return repeat;
      throw new RateLimitedError();
    }
    try {
      const appended = await this.manager.sendUserAction(ref, action, idempotencyKey);
      if (appended.duplicate) await reservation.cancel();
      return appended;
    } catch (error) {
      await reservation.cancel();
      throw error;
    }
  }

  /** The stored event a repeated idempotency key refers to; `CONFLICT` when its content differs. */
  private async findRepeat(
    ref: ConversationRef,
    action: UserAction,
    idempotencyKey: string | undefined,
  ): Promise<AppendedEvent | null> {
    const draft = userActionDraft(action, idempotencyKey);
    if (draft.clientEventId === undefined) return null;
    const stored = await this.store.findEventByClientEventId(
      ref.tenantId,
      ref.conversationId,
      draft.clientEventId,
    );
    if (!stored) return null;
    const {
      id: _id,
      timestamp: _timestamp,
      cause: _cause,
      client_event_id: _key,
      source,
      ...body
    } = stored as StoredEvent & { client_event_id?: string };
    if (source !== draft.source || !isDeepStrictEqual(body, draft.body)) {
      throw new ConflictError('this idempotency key was used for another action');
    }
    return { event: stored, duplicate: true };
  }

  async events(
    principal: Principal,
    conversationId: string,
    query: ListEventsQuery,
  ): Promise<{ events: StoredEvent[]; has_more: boolean }> {
    await this.find(principal, conversationId);
    if (query.end_id !== undefined && query.end_id < query.start_id) {
      throw new BadRequestError('end_id must not be below start_id', 'end_id');
    }
    const events = await this.store.readEvents(principal.tenantId, conversationId, {
      fromId: query.start_id,
      toId: query.end_id,
      reverse: query.reverse,
      limit: query.limit + 1,
    });
    return { events: events.slice(0, query.limit), has_more: events.length > query.limit };
  }

  /** Stored events after `afterId`, for replays (no visibility check: callers did it). */
  readAfter(
    tenantId: string,
    conversationId: string,
    fromId: number,
    toId: number | undefined,
    limit: number,
  ): Promise<StoredEvent[]> {
    return this.store.readEvents(tenantId, conversationId, { fromId, toId, limit });
  }

  async state(principal: Principal, conversationId: string): Promise<ConversationStateResponse> {
    const record = await this.find(principal, conversationId);
    const snapshot = await this.store.getSnapshot(principal.tenantId, conversationId);
    assertVisible(principal, snapshot?.conversation ?? null);
    const { conversation, state } = snapshot!;
    const response: ConversationStateResponse = {
      agent_state: conversation.agentState,
      state,
      metrics: conversation.metrics,
      last_event_id: conversation.lastEventId,
    };
    if (principal.isAdmin) {
      const runtime = await this.manager.runtime(refOf(record));
      if (runtime)
        response.runtime = { worker_id: runtime.workerId, lease_epoch: runtime.leaseEpoch };
    }
    return response;
  }

  attach(connectionId: string, conversation: ConversationRecord): Promise<void> {
    return this.manager.attach({ connectionId, ...refOf(conversation) });
  }

  detach(connectionId: string): Promise<void> {
    return this.manager.detach(connectionId);
  }

  ensureRunning(conversation: ConversationRecord): Promise<ConversationStatus> {
    return this.manager.ensureRunning(refOf(conversation));
  }
}

/** The manager acts for the conversation's owner, whose limits apply. */
function refOf(conversation: ConversationRecord): ConversationRef {
  return {
    tenantId: conversation.tenantId,
    userId: conversation.userId,
    conversationId: conversation.id,
  };
}

function parseReplay(json: string): EventDraft[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    throw new BadRequestError('replay_json is not valid JSON', 'replay_json');
  }
  const result = z.array(ReplayEventSchema).max(MAX_REPLAY_EVENTS).safeParse(parsed);
  if (!result.success) {
    const issue = result.error.issues[0];
    const path = ['replay_json', ...(issue?.path ?? []).map(String)].join('.');
    throw new BadRequestError(`${path}: ${issue?.message ?? 'invalid'}`, path);
  }
  return result.data.map(({ source, ...body }) => ({ source, body }));
}
