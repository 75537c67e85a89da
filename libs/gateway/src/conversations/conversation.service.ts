import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import {
  isLiveStatus,
  BadRequestError,
  ConcurrencyLimitError,
  ConflictError,
  DomainError,
  RateLimitedError,
  refOf,
  roomKey,
  userActionDraft,
  toConversationInfo,
  type AgentFactory,
  type AppendedEvent,
  type EventPage,
  type ConversationBroadcaster,
  type ConversationManager,
  type ConversationRecord,
  type ConversationRef,
  type ConversationStore,
  type DataLifecycleStore,
  type DeletionEffects,
  type RateLimitReservation,
  type SendOptions,
  type SlotClaim,
  type UserActionRateLimiter,
} from '@cs/core';
import {
  StatusId,
  isAction,
  type ConversationInfo,
  type ConversationPage,
  type ConversationPresence,
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
import { ServiceMetrics } from '@cs/observability';
import { assertVisible, type Principal } from '../auth/principal.js';
import {
  AGENT_FACTORY,
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  DATA_LIFECYCLE_STORE,
  ROOM_BROADCASTER,
  USER_ACTION_RATE_LIMITER,
} from '../tokens.js';
import { ConversationRoomHub } from '../realtime/conversation-room-hub.js';
import { ConversationSockets } from '../realtime/conversation-sockets.js';
import { ConversationExporter } from '../lifecycle/conversation-exporter.js';
import type { NdjsonSink } from '../lifecycle/ndjson-response.js';
import { NO_REPLAY, parseReplay, replayDrafts } from './conversation-replay.js';
import { settingsOf } from './conversation-settings.js';
import { checkConfirmationAnswer, findRepeat } from './user-action-admission.js';

/** What a create answers, and whether it made the conversation (201) or found it (200). */
export interface CreatedConversation {
  created: boolean;
  conversation_id: string;
  conversation_status: ConversationStatus;
}

/** The app name of conversations created through this API. */
export const DEFAULT_APP_NAME = 'default';
/** PROTOCOL.md: a page of events is at most 4 MiB (then `has_more`). */
const MAX_EVENT_PAGE_BYTES = 4 * 1024 * 1024;
/** A replay holds at most this much of a client's history in memory at once. */
const REPLAY_PAGE_BYTES = 1024 * 1024;
const INITIAL_MESSAGE_KEY = 'initial_user_msg';

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
    @Inject(DATA_LIFECYCLE_STORE) private readonly lifecycle: DataLifecycleStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    @Inject(USER_ACTION_RATE_LIMITER) private readonly rateLimiter: UserActionRateLimiter,
    @Inject(AGENT_FACTORY) private readonly agents: AgentFactory,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    private readonly sockets: ConversationSockets,
    hub: ConversationRoomHub,
    @Optional() @Inject(ROOM_BROADCASTER) broadcaster: ConversationBroadcaster | null,
  ) {
    this.rooms = broadcaster ?? hub;
    this.exporter = new ConversationExporter(store, config.agent.multitaskStrategy);
  }

  private readonly exporter: ConversationExporter;

  /** Where SSE streams are told of a deletion: every gateway's (cluster) or this process's. */
  private readonly rooms: ConversationBroadcaster;
  private readonly logger = new Logger(ConversationService.name);

  /** The conversation if the caller may see it; `NOT_FOUND` otherwise. */
  async find(principal: Principal, conversationId: string): Promise<ConversationRecord> {
    const conversation = await this.store.getConversation(principal.tenantId, conversationId);
    assertVisible(principal, conversation);
    return conversation;
  }

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
      if (result.created) this.storedUserActions(actions);
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

  private info(record: ConversationRecord): ConversationInfo {
    return toConversationInfo(record, this.config.agent.multitaskStrategy);
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

  async list(principal: Principal, query: ListConversationsQuery): Promise<ConversationPage> {
    const everyone = principal.isAdmin && query.all;
    const page = await this.store.listConversations(principal.tenantId, {
      userId: everyone ? undefined : principal.userId,
      limit: query.limit,
      cursor: query.page_id,
    });
    return {
      results: page.items.map((record) => this.info(record)),
      next_page_id: page.nextCursor,
    };
  }

  async get(principal: Principal, conversationId: string): Promise<ConversationInfo> {
    return this.info(await this.find(principal, conversationId));
  }

  async update(
    principal: Principal,
    conversationId: string,
    patch: PatchConversationBody,
  ): Promise<ConversationInfo> {
    await this.find(principal, conversationId);
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
    return this.info(updated);
  }

  /**
   * `DELETE /conversations/:id`. An admin's delete of another user's
   * conversation is audited, in the delete's transaction.
   */
  async delete(principal: Principal, conversationId: string): Promise<void> {
    const conversation = await this.find(principal, conversationId);
    const audit =
      conversation.userId === principal.userId
        ? undefined
        : {
            tenantId: principal.tenantId,
            actor: principal.userId,
            action: 'conversation.delete',
            target: `conversation:${conversationId}`,
          };
    await this.remove(refOf(conversation), audit ? { audit } : {});
  }

  /**
   * Stops and deletes the conversation (with what `effects` adds to the
   * delete's transaction), then closes every socket and stream of it, on
   * every gateway, after telling each why: sockets through the Socket.IO
   * adapter, SSE streams through the conversation's room (a reused id gets
   * another room, so none can stay behind). What `DELETE`, retention and an
   * erasure do; false when it was not deleted (gone already, another
   * incarnation, or a retention delete its user came back to).
   */
  async remove(ref: ConversationRef, effects: DeletionEffects = {}): Promise<boolean> {
    try {
      await this.manager.stop(ref);
    } catch (error) {
      // Deleted meanwhile: nothing to stop; the delete below finds nothing either.
      if (!(error instanceof DomainError && error.code === 'NOT_FOUND')) throw error;
    }
    const deleted = await this.lifecycle.deleteConversation(ref.tenantId, ref.conversationId, {
      incarnation: ref.incarnation,
      ...effects,
    });
    if (!deleted) return false;
    const room = roomKey(ref);
    const status = {
      status_update: true,
      type: 'error',
      id: StatusId.ConversationDeleted,
      message: 'the conversation was deleted',
    } as const;
    this.sockets.closeDeleted(room, status);
    this.rooms.publishStatus(room, status);
    return true;
  }

  /**
   * `GET /conversations/:id/export` into `sink` (see `ConversationExporter`).
   * An admin's export of another user's conversation is audited first.
   */
  async exportTo(
    principal: Principal,
    conversation: ConversationRecord,
    sink: NdjsonSink,
  ): Promise<number> {
    if (conversation.userId !== principal.userId) {
      await this.lifecycle.recordAudit(
        {
          tenantId: principal.tenantId,
          actor: principal.userId,
          action: 'conversation.export',
          target: `conversation:${conversation.id}`,
        },
        new Date(),
      );
    }
    return this.exporter.export(conversation.tenantId, conversation.id, sink);
  }

  /** The export of a conversation the caller was found to see (a user export's). */
  exportOne(tenantId: string, conversationId: string, sink: NdjsonSink): Promise<number> {
    return this.exporter.export(tenantId, conversationId, sink);
  }

  /** The sockets attached to the conversation on every gateway. */
  async presence(principal: Principal, conversationId: string): Promise<ConversationPresence> {
    const conversation = await this.find(principal, conversationId);
    return { sockets: await this.sockets.count(roomKey(refOf(conversation))) };
  }

  /** `POST …/start`: one user action (it stores the agent's start), as a socket's would be. */
  async start(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    const conversation = await this.find(principal, conversationId);
    // A start of a running agent stores nothing: not counted, not refused.
    if (isLiveStatus(conversation.status)) {
      return this.manager.ensureRunning(refOf(conversation));
    }
    return this.countedAction(principal, () => this.manager.ensureRunning(refOf(conversation)));
  }

  /** `POST …/stop`: one user action (it stores `stopped`), as `change_agent_state` is. */
  async stop(principal: Principal, conversationId: string): Promise<ConversationStatus> {
    const conversation = await this.find(principal, conversationId);
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
      this.storedUserActions(1);
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
    const conversation = await this.find(principal, conversationId);
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
      else this.storedUserActions(1);
      return appended;
    } catch (error) {
      await reservation.cancel();
      throw error;
    }
  }

  /**
   * Counts the user actions a request stored (`cs_user_actions_total`) as
   * `RATE_LIMIT_PER_MINUTE` counts them (PROTOCOL.md): an action sent over
   * the socket or REST; a create, its `initial_user_msg` and each replayed
   * event. An idempotent repeat or a refused action is none. Called once the
   * request that stored them is answered with success.
   */
  private storedUserActions(count: number): void {
    this.metrics.userActions.inc(count);
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
    const page = await this.store.readEventPage(principal.tenantId, conversationId, {
      fromId: query.start_id,
      toId: query.end_id,
      reverse: query.reverse,
      limit: query.limit,
      maxBytes: MAX_EVENT_PAGE_BYTES,
    });
    return { events: page.events, has_more: page.hasMore };
  }

  /**
   * A page of stored events from `fromId`, for replays (no visibility check:
   * callers did it); nothing once the conversation is not this one any more.
   */
  readPage(
    conversation: ConversationRecord,
    fromId: number,
    toId: number | undefined,
    limit: number,
  ): Promise<EventPage> {
    return this.store.readEventPage(conversation.tenantId, conversation.id, {
      fromId,
      toId,
      limit,
      maxBytes: REPLAY_PAGE_BYTES,
      incarnation: conversation.incarnation,
    });
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
