import {
  Body,
  Logger,
  Controller,
  Delete,
  Get,
  Headers,
  HttpCode,
  Param,
  Patch,
  Post,
  Query,
  Req,
  Res,
  UseGuards,
} from '@nestjs/common';
import { ApiBearerAuth, ApiBody, ApiHeader, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import type { Request, Response } from 'express';
import { BadRequestError, NotFoundError } from '@cs/core';
import {
  ConversationPresenceSchema,
  CreateConversationBodySchema,
  EmptyBodySchema,
  ListConversationsQuerySchema,
  ListEventsQuerySchema,
  PatchConversationBodySchema,
  TurnResponseSchema,
  UserActionSchema,
  type ConversationInfo,
  type ConversationPage,
  type ConversationPresence,
  type ConversationStateResponse,
  type ConversationStatus,
  type SentUserAction,
  type TurnResponse,
} from '@cs/protocol';
import { z } from 'zod';
import { CurrentPrincipal, HttpAuthGuard } from '../auth/http-auth.guard.js';
import type { Principal } from '../auth/principal.js';
import { ConversationCreation } from '../conversations/conversation-creation.service.js';
import { ConversationService } from '../conversations/conversation.service.js';
import { UserActionDelivery } from '../conversations/user-action-delivery.service.js';
import { EventStreamService } from '../realtime/event-stream.service.js';
import { TurnWatchService } from '../realtime/turn-watch.service.js';
import { preferredWait } from './prefer-header.js';
import { cutShort, streamNdjson } from '../lifecycle/ndjson-response.js';
import { conversationId, idempotencyKeyOf, parseInput } from './validation.js';
import { openApiSchema } from './openapi.js';

const LastEventIdSchema = z
  .string()
  .regex(/^-?\d{1,16}$/, 'must be an integer')
  .transform(Number)
  .pipe(z.number().int().min(-1));

/** The REST API of docs/protocol.md under `/api/conversations`. */
@ApiTags('conversations')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/conversations')
export class ConversationsController {
  private readonly logger = new Logger(ConversationsController.name);

  constructor(
    private readonly conversations: ConversationService,
    private readonly creation: ConversationCreation,
    private readonly delivery: UserActionDelivery,
    private readonly streams: EventStreamService,
    private readonly turns: TurnWatchService,
  ) {}

  @Post()
  @ApiBody({ schema: openApiSchema(CreateConversationBodySchema) })
  async create(
    @CurrentPrincipal() principal: Principal,
    @Body() body: unknown,
    @Res({ passthrough: true }) response: Response,
  ): Promise<{ conversation_id: string; conversation_status: ConversationStatus }> {
    const input = parseInput(CreateConversationBodySchema, body ?? {});
    const { created, ...result } = await this.creation.create(principal, input);
    response.status(created ? 201 : 200);
    return result;
  }

  @Get()
  list(
    @CurrentPrincipal() principal: Principal,
    @Query() query: unknown,
  ): Promise<ConversationPage> {
    return this.conversations.list(principal, parseInput(ListConversationsQuerySchema, query));
  }

  @Get(':id')
  get(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
  ): Promise<ConversationInfo> {
    return this.conversations.get(principal, conversationId(id));
  }

  @Patch(':id')
  @ApiBody({ schema: openApiSchema(PatchConversationBodySchema) })
  update(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
  ): Promise<ConversationInfo> {
    const patch = parseInput(PatchConversationBodySchema, body ?? {});
    return this.delivery.update(principal, conversationId(id), patch);
  }

  @Delete(':id')
  @HttpCode(204)
  async delete(@CurrentPrincipal() principal: Principal, @Param('id') id: string): Promise<void> {
    await this.conversations.delete(principal, conversationId(id));
  }

  @Post(':id/start')
  @HttpCode(200)
  async start(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
  ): Promise<{ conversation_status: ConversationStatus }> {
    parseInput(EmptyBodySchema, body ?? {});
    return { conversation_status: await this.delivery.start(principal, conversationId(id)) };
  }

  @Post(':id/stop')
  @HttpCode(200)
  async stop(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
  ): Promise<{ conversation_status: ConversationStatus }> {
    parseInput(EmptyBodySchema, body ?? {});
    return { conversation_status: await this.delivery.stop(principal, conversationId(id)) };
  }

  @Get(':id/events')
  events(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Query() query: unknown,
  ) {
    return this.conversations.events(
      principal,
      conversationId(id),
      parseInput(ListEventsQuerySchema, query),
    );
  }

  @Post(':id/events')
  @ApiBody({ schema: openApiSchema(UserActionSchema) })
  @ApiHeader({ name: 'Prefer', required: false, description: 'wait=<seconds> (1..120)' })
  async send(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
    @Headers('idempotency-key') idempotencyKey: string | undefined,
    @Headers('prefer') prefer: string | undefined,
    @Res({ passthrough: true }) response: Response,
  ): Promise<SentUserAction> {
    const target = conversationId(id);
    const key = idempotencyKeyOf(idempotencyKey);
    const waitS = preferredWait(prefer);
    const action = parseInput(UserActionSchema, body);
    // Two keys for one action: keeping either would store it again when retried with the other.
    if (
      key !== undefined &&
      action.client_event_id !== undefined &&
      key !== action.client_event_id
    ) {
      throw new BadRequestError(
        "the Idempotency-Key header and the body's client_event_id differ",
        'client_event_id',
      );
    }
    if (waitS === undefined) {
      const appended = await this.delivery.sendUserAction(principal, target, action, key);
      response.status(appended.duplicate ? 200 : 201);
      return { event_id: appended.event.id };
    }
    const conversation = await this.conversations.find(principal, target);
    // In the room before the message is stored: its turn's events cannot be missed.
    const watch = this.turns.watch(conversation);
    const left = () => watch.dispose();
    response.on('close', left);
    try {
      const appended = await this.delivery.sendUserActionToFound(
        principal,
        conversation,
        action,
        key,
      );
      const turn = await watch.until(appended.event.id, waitS * 1000);
      response.status(appended.duplicate ? 200 : 201);
      response.setHeader('Preference-Applied', `wait=${waitS}`);
      return {
        event_id: appended.event.id,
        turn: turn && { agent_state: turn.agentState, events: [...turn.events] },
      };
    } finally {
      response.off('close', left);
      watch.dispose();
    }
  }

  @Get(':id/turns/:event_id')
  @ApiOkResponse({ schema: openApiSchema(TurnResponseSchema) })
  async turn(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Param('event_id') eventId: string,
  ): Promise<TurnResponse> {
    const conversation = await this.conversations.find(principal, conversationId(id));
    // Not an event id: no such turn (as a non-UUID conversation id is none).
    if (!/^\d{1,15}$/.test(eventId)) throw new NotFoundError('event not found');
    const turn = await this.turns.read(conversation, Number(eventId));
    return { status: turn.status, agent_state: turn.agentState, events: [...turn.events] };
  }

  @Get(':id/state')
  state(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
  ): Promise<ConversationStateResponse> {
    return this.conversations.state(principal, conversationId(id));
  }

  @Get(':id/presence')
  @ApiOkResponse({
    description: 'the sockets attached to the conversation on every gateway',
    schema: openApiSchema(ConversationPresenceSchema),
  })
  presence(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
  ): Promise<ConversationPresence> {
    return this.conversations.presence(principal, conversationId(id));
  }

  /** NDJSON: the `ConversationInfo`, every event in id order, then `{ state }`. */
  @Get(':id/export')
  @ApiOkResponse({ description: 'application/x-ndjson: the conversation, its events, its state' })
  async export(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Res() response: Response,
  ): Promise<void> {
    const conversation = await this.conversations.find(principal, conversationId(id));
    await streamNdjson(
      response,
      async (sink) => {
        await this.conversations.exportTo(principal, conversation, sink);
      },
      cutShort(this.logger),
    );
  }

  @Get(':id/stream')
  async stream(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Headers('last-event-id') lastEventId: string | undefined,
    @Req() request: Request,
    @Res() response: Response,
  ): Promise<void> {
    const conversation = await this.conversations.find(principal, conversationId(id));
    const afterId =
      lastEventId === undefined
        ? -1
        : parseInput(z.object({ 'Last-Event-ID': LastEventIdSchema }), {
            'Last-Event-ID': lastEventId,
          })['Last-Event-ID'];
    await this.streams.openStream(principal, conversation, afterId, request, response);
  }
}
