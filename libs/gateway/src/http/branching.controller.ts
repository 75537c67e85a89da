import { Body, Controller, Headers, Param, Post, Res, UseGuards } from '@nestjs/common';
import { ApiBearerAuth, ApiBody, ApiTags } from '@nestjs/swagger';
import type { Response } from 'express';
import {
  EditBodySchema,
  ForkBodySchema,
  RegenerateBodySchema,
  RewindBodySchema,
  type ConversationStatus,
} from '@cs/protocol';
import { z } from 'zod';
import { CurrentPrincipal, HttpAuthGuard } from '../auth/http-auth.guard.js';
import type { Principal } from '../auth/principal.js';
import { ConversationBranchingService } from '../conversations/conversation-branching.service.js';
import { openApiSchema } from './openapi.js';
import { conversationId, idempotencyKeyOf, parseInput } from './validation.js';

/** A path's event id: a non-negative integer, else 400 naming `event_id`. */
const EventIdParamSchema = z.object({
  event_id: z
    .string()
    .regex(/^\d{1,16}$/, 'must be an event id')
    .transform(Number)
    .pipe(z.number().int().min(0).max(Number.MAX_SAFE_INTEGER)),
});

/**
 * The branching routes of docs/protocol.md ("Branching: fork, rewind, edit,
 * regenerate") under `/api/conversations`. Each takes an `Idempotency-Key`:
 * a repeat answers 200 with the first result.
 */
@ApiTags('conversations')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/conversations')
export class BranchingController {
  constructor(private readonly branching: ConversationBranchingService) {}

  @Post(':id/fork')
  @ApiBody({ schema: openApiSchema(ForkBodySchema) })
  async fork(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
    @Headers('idempotency-key') idempotencyKey: string | undefined,
    @Res({ passthrough: true }) response: Response,
  ): Promise<{ conversation_id: string; conversation_status: ConversationStatus }> {
    const source = conversationId(id);
    const key = idempotencyKeyOf(idempotencyKey);
    const input = parseInput(ForkBodySchema, body ?? {});
    const { created, ...result } = await this.branching.fork(principal, source, input, key);
    response.status(created ? 201 : 200);
    return result;
  }

  @Post(':id/rewind')
  @ApiBody({ schema: openApiSchema(RewindBodySchema) })
  async rewind(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
    @Headers('idempotency-key') idempotencyKey: string | undefined,
    @Res({ passthrough: true }) response: Response,
  ): Promise<{ event_id: number }> {
    const target = conversationId(id);
    const key = idempotencyKeyOf(idempotencyKey);
    const input = parseInput(RewindBodySchema, body ?? {});
    const { event_id } = await this.branching.rewind(principal, target, input.to_event_id, key);
    // docs/protocol.md: a rewind answers 200 (first time and repeats alike).
    response.status(200);
    return { event_id };
  }

  @Post(':id/events/:event_id/edit')
  @ApiBody({ schema: openApiSchema(EditBodySchema) })
  async edit(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Param('event_id') eventId: string,
    @Body() body: unknown,
    @Headers('idempotency-key') idempotencyKey: string | undefined,
    @Res({ passthrough: true }) response: Response,
  ): Promise<{ event_id: number }> {
    const target = conversationId(id);
    const key = idempotencyKeyOf(idempotencyKey);
    const { event_id: edited } = parseInput(EventIdParamSchema, { event_id: eventId });
    const input = parseInput(EditBodySchema, body ?? {});
    const { created, event_id } = await this.branching.edit(
      principal,
      target,
      edited,
      input.content,
      key,
    );
    response.status(created ? 201 : 200);
    return { event_id };
  }

  @Post(':id/regenerate')
  @ApiBody({ schema: openApiSchema(RegenerateBodySchema) })
  async regenerate(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
    @Headers('idempotency-key') idempotencyKey: string | undefined,
    @Res({ passthrough: true }) response: Response,
  ): Promise<{ event_id: number }> {
    const target = conversationId(id);
    const key = idempotencyKeyOf(idempotencyKey);
    parseInput(RegenerateBodySchema, body ?? {});
    const { created, event_id } = await this.branching.regenerate(principal, target, key);
    response.status(created ? 201 : 200);
    return { event_id };
  }
}
