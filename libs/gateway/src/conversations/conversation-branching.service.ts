/**
 * Fork, rewind, edit and regenerate (docs/protocol.md "Branching"), whichever
 * door and gateway the request came through. A rewind first stops the
 * conversation's agent wherever it runs (its partial text is stored as
 * interrupted, then undone with the rest); the store then writes the rewind
 * in one transaction; an agent started afterwards reads the log with the
 * undone marks, on whichever worker, so no holder sees undone events again.
 */
import { Inject, Injectable, Optional } from '@nestjs/common';
import type { AppConfig } from '@cs/config';
import {
  BadRequestError,
  ConflictError,
  RateLimitedError,
  refOf,
  roomKey,
  type AppendedEvent,
  type ConversationBroadcaster,
  type ConversationManager,
  type ConversationRecord,
  type ConversationStore,
  type RewindRequest,
  type UserActionRateLimiter,
} from '@cs/core';
import { ServiceMetrics } from '@cs/observability';
import {
  isAction,
  rewindTarget,
  type ConversationStatus,
  type ForkBody,
  type StoredEvent,
} from '@cs/protocol';
import { createHash, randomUUID } from 'node:crypto';
import type { Principal } from '../auth/principal.js';
import { ConversationRoomHub } from '../realtime/conversation-room-hub.js';
import {
  APP_CONFIG,
  CONVERSATION_MANAGER,
  CONVERSATION_STORE,
  ROOM_BROADCASTER,
  USER_ACTION_RATE_LIMITER,
} from '../tokens.js';
import { ConversationService } from './conversation.service.js';

/** How far back a regenerate looks for the last user message, page by page. */
const SEARCH_PAGE = 100;

export interface BranchResult {
  /** False for an idempotent repeat (200 rather than 201). */
  created: boolean;
}

@Injectable()
export class ConversationBranchingService {
  private readonly rooms: ConversationBroadcaster;

  constructor(
    @Inject(APP_CONFIG) private readonly config: AppConfig,
    @Inject(CONVERSATION_STORE) private readonly store: ConversationStore,
    @Inject(CONVERSATION_MANAGER) private readonly manager: ConversationManager,
    @Inject(USER_ACTION_RATE_LIMITER) private readonly rateLimiter: UserActionRateLimiter,
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
    private readonly conversations: ConversationService,
    hub: ConversationRoomHub,
    @Optional() @Inject(ROOM_BROADCASTER) broadcaster: ConversationBroadcaster | null,
  ) {
    this.rooms = broadcaster ?? hub;
  }

  /**
   * `POST …/fork`: one user action. With an idempotency key the fork's id
   * follows from it (and the caller and source), so a repeat finds the fork
   * made first.
   */
  async fork(
    principal: Principal,
    sourceId: string,
    body: ForkBody,
    idempotencyKey: string | undefined,
  ): Promise<BranchResult & { conversation_id: string; conversation_status: ConversationStatus }> {
    await this.conversations.find(principal, sourceId);
    const id =
      idempotencyKey === undefined
        ? randomUUID()
        : forkIdOf(principal.tenantId, principal.userId, sourceId, idempotencyKey);
    const result = await this.counted(
      principal,
      () =>
        this.store.fork(principal.tenantId, sourceId, {
          conversationId: id,
          userId: principal.userId,
          ...(body.at_event_id === undefined ? {} : { atEventId: body.at_event_id }),
          ...(body.title === undefined ? {} : { title: body.title }),
          ...(body.metadata === undefined ? {} : { metadata: body.metadata }),
        }),
      (made) => !made.created,
      async () => {
        if (idempotencyKey === undefined) return null;
        const found = await this.store.getConversation(principal.tenantId, id);
        return found && found.userId === principal.userId
          ? { conversation: found, created: false }
          : null;
      },
    );
    return {
      created: result.created,
      conversation_id: result.conversation.id,
      conversation_status: 'STOPPED',
    };
  }

  /** `POST …/rewind`: stops the agent, rewinds; an agent that ran runs again. */
  async rewind(
    principal: Principal,
    conversationId: string,
    toEventId: number,
    idempotencyKey: string | undefined,
  ): Promise<BranchResult & { event_id: number }> {
    const conversation = await this.conversations.find(principal, conversationId);
    const repeat = await this.repeatedRewind(conversation, idempotencyKey, toEventId);
    if (repeat) return { created: false, event_id: repeat.id };
    // Checked before the stop, which stores events of its own (the store checks again).
    await this.assertRewindPoint(conversation, toEventId);
    const appended = await this.counted(
      principal,
      async () => {
        const wasRunning = await this.stopAgent(conversation);
        const rewound = await this.rewindStopped(conversation, {
          toEventId,
          ...(idempotencyKey === undefined ? {} : { clientEventId: idempotencyKey }),
        });
        if (wasRunning && !rewound.duplicate) await this.manager.ensureRunning(refOf(conversation));
        return rewound;
      },
      (made) => made.duplicate,
    );
    return { created: !appended.duplicate, event_id: appended.event.id };
  }

  /**
   * `POST …/events/:event_id/edit`: a rewind to just before the user message
   * `eventId`, then the new message, answered as any message. One user action.
   */
  async edit(
    principal: Principal,
    conversationId: string,
    eventId: number,
    content: string,
    idempotencyKey: string | undefined,
  ): Promise<BranchResult & { event_id: number }> {
    const conversation = await this.conversations.find(principal, conversationId);
    const action = {
      action: 'message' as const,
      args: { content, image_urls: [], file_urls: [] },
    };
    if (idempotencyKey !== undefined) {
      const stored = await this.store.findEventByClientEventId(
        principal.tenantId,
        conversationId,
        idempotencyKey,
      );
      if (stored) {
        if (
          !isAction(stored) ||
          stored.action !== 'message' ||
          stored.args['content'] !== content
        ) {
          throw new ConflictError('this idempotency key was used for another action');
        }
        return { created: false, event_id: stored.id };
      }
    }
    const [edited] = await this.store.readEvents(principal.tenantId, conversationId, {
      fromId: eventId,
      toId: eventId,
      limit: 1,
    });
    if (
      !edited ||
      edited.source !== 'user' ||
      !isAction(edited) ||
      edited.action !== 'message' ||
      edited.undone_by !== undefined
    ) {
      throw new BadRequestError('event_id must be a user message of the conversation', 'event_id');
    }
    const appended = await this.counted(
      principal,
      async () => {
        await this.stopAgent(conversation);
        await this.rewindStopped(conversation, {
          toEventId: eventId - 1,
          ...(idempotencyKey === undefined ? {} : { clientEventId: editRewindKey(idempotencyKey) }),
        });
        // A message to a stopped conversation starts its agent.
        return this.manager.sendUserAction(refOf(conversation), action, idempotencyKey, {
          status: 'STOPPED',
          defaultMultitaskStrategy: this.config.agent.multitaskStrategy,
        });
      },
      (made) => made.duplicate,
    );
    return { created: !appended.duplicate, event_id: appended.event.id };
  }

  /**
   * `POST …/regenerate`: a rewind to the last user message that is not
   * undone, which is then answered again. One user action.
   */
  async regenerate(
    principal: Principal,
    conversationId: string,
    idempotencyKey: string | undefined,
  ): Promise<BranchResult & { event_id: number }> {
    const conversation = await this.conversations.find(principal, conversationId);
    if (idempotencyKey !== undefined) {
      const stored = await this.store.findEventByClientEventId(
        principal.tenantId,
        conversationId,
        idempotencyKey,
      );
      if (stored) {
        if (rewindTarget(stored) === null) {
          throw new ConflictError('this idempotency key was used for another action');
        }
        return { created: false, event_id: stored.id };
      }
    }
    const message = await this.lastUserMessage(conversation);
    if (!message) {
      throw new BadRequestError('the conversation has no user message to answer again');
    }
    const appended = await this.counted(
      principal,
      async () => {
        await this.stopAgent(conversation);
        const rewound = await this.rewindStopped(conversation, {
          toEventId: message.id,
          answerAgain: true,
          ...(idempotencyKey === undefined ? {} : { clientEventId: idempotencyKey }),
        });
        await this.manager.ensureRunning(refOf(conversation));
        return rewound;
      },
      (made) => made.duplicate,
    );
    return { created: !appended.duplicate, event_id: appended.event.id };
  }

  /** `to_event_id` must name an event of the conversation, not undone. */
  private async assertRewindPoint(
    conversation: ConversationRecord,
    toEventId: number,
  ): Promise<void> {
    const [target] =
      toEventId <= conversation.lastEventId
        ? await this.store.readEvents(conversation.tenantId, conversation.id, {
            fromId: toEventId,
            toId: toEventId,
            limit: 1,
          })
        : [];
    if (!target) {
      throw new BadRequestError('to_event_id must be an event of the conversation', 'to_event_id');
    }
    if (target.undone_by !== undefined) {
      throw new BadRequestError('to_event_id is an undone event', 'to_event_id');
    }
  }

  /** A rewind stored already under this key (`CONFLICT` when it named another point). */
  private async repeatedRewind(
    conversation: ConversationRecord,
    key: string | undefined,
    toEventId: number,
  ): Promise<StoredEvent | null> {
    if (key === undefined) return null;
    const stored = await this.store.findEventByClientEventId(
      conversation.tenantId,
      conversation.id,
      key,
    );
    if (!stored) return null;
    if (rewindTarget(stored) !== toEventId) {
      throw new ConflictError('this idempotency key was used for another action');
    }
    return stored;
  }

  /**
   * Stops the agent wherever it runs, and waits until it has stored what the
   * stop means (the partial text as interrupted, the calls that will not
   * run): those events come before the rewind, which undoes them. True when
   * it ran.
   */
  private async stopAgent(conversation: ConversationRecord): Promise<boolean> {
    const ref = refOf(conversation);
    const status = await this.manager.status(ref);
    if (status !== 'RUNNING' && status !== 'STARTING') return false;
    await this.manager.stop(ref);
    return true;
  }

  /** Stores the rewind and tells the room: the rewind event and what it stored after it. */
  private async rewindStopped(
    conversation: ConversationRecord,
    request: RewindRequest,
  ): Promise<AppendedEvent> {
    const appended = await this.store.rewind(conversation.tenantId, conversation.id, {
      ...request,
      incarnation: conversation.incarnation,
    });
    if (!appended.duplicate) {
      const stored = await this.store.readEvents(conversation.tenantId, conversation.id, {
        fromId: appended.event.id,
        limit: SEARCH_PAGE,
      });
      this.rooms.publishEvents(roomKey(refOf(conversation)), stored);
    }
    return appended;
  }

  /** The newest user message that is not undone, or null. */
  private async lastUserMessage(conversation: ConversationRecord): Promise<StoredEvent | null> {
    const current = await this.store.getConversation(conversation.tenantId, conversation.id);
    for (let upTo = current?.lastEventId ?? -1; upTo >= 0; upTo -= SEARCH_PAGE) {
      const page = await this.store.readEvents(conversation.tenantId, conversation.id, {
        fromId: Math.max(0, upTo - SEARCH_PAGE + 1),
        toId: upTo,
        reverse: true,
        limit: SEARCH_PAGE,
      });
      const found = page.find(
        (event) =>
          event.source === 'user' &&
          isAction(event) &&
          event.action === 'message' &&
          event.undone_by === undefined,
      );
      if (found) return found;
    }
    return null;
  }

  /**
   * Runs `act` as one user action of `RATE_LIMIT_PER_MINUTE`; a result that
   * stored nothing (`repeated`) is given back. Refused by the limit, a
   * `repeat` found stored already is answered instead.
   */
  private async counted<T>(
    principal: Principal,
    act: () => Promise<T>,
    repeated: (result: T) => boolean,
    repeat: () => Promise<T | null> = () => Promise.resolve(null),
  ): Promise<T> {
    const reservation = await this.rateLimiter.reserve(principal.tenantId, principal.userId);
    if (!reservation.reserved) {
      const found = await repeat();
      if (found !== null) return found;
      throw RateLimitedError.forActions(reservation.retryAfterMs);
    }
    let result: T;
    try {
      result = await act();
    } catch (error) {
      await reservation.cancel();
      throw error;
    }
    if (repeated(result)) await reservation.cancel();
    else this.metrics.userActions.inc(1);
    return result;
  }
}

/**
 * The key of an edit's rewind, in the conversation's one key space beside
 * the edit's message (which takes the key itself), within the 128 characters
 * of a `client_event_id`.
 */
function editRewindKey(key: string): string {
  return key.length <= 120
    ? `${key}:rewind`
    : `rewind:${createHash('sha256').update(key).digest('hex')}`;
}

/**
 * The id of the fork an idempotency key makes: a UUID (version 8, RFC 9562)
 * from a hash of the tenant, caller, source and key, so that a repeat finds it.
 */
export function forkIdOf(tenantId: string, userId: string, sourceId: string, key: string): string {
  const hex = createHash('sha256')
    .update(JSON.stringify(['fork', tenantId, userId, sourceId, key]))
    .digest('hex');
  const variant = ((parseInt(hex[16]!, 16) & 0x3) | 0x8).toString(16);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-8${hex.slice(13, 16)}-${variant}${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
}
