import { Controller, Get, Inject, Query, UseGuards } from '@nestjs/common';
import { ApiBearerAuth, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import { NotFoundError, type ConversationStore } from '@cs/core';
import { UsageQuerySchema, UsageResponseSchema, type UsageResponse } from '@cs/protocol';
import { CurrentPrincipal, HttpAuthGuard } from '../auth/http-auth.guard.js';
import type { Principal } from '../auth/principal.js';
import { CONVERSATION_STORE } from '../tokens.js';
import { openApiSchema } from './openapi.js';
import { parseInput } from './validation.js';

/**
 * `GET /api/usage` (docs/protocol.md "Usage and budgets"): the caller's own model
 * usage, or for an `admin` its tenant's (`user_id` picks one user). Another
 * user's usage does not exist for a caller who is not an admin (404, as
 * another user's conversation).
 */
@ApiTags('usage')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/usage')
export class UsageController {
  constructor(@Inject(CONVERSATION_STORE) private readonly store: ConversationStore) {}

  @Get()
  @ApiOkResponse({ schema: openApiSchema(UsageResponseSchema) })
  async usage(
    @CurrentPrincipal() principal: Principal,
    @Query() query: unknown,
  ): Promise<UsageResponse> {
    const input = parseInput(UsageQuerySchema, query);
    if (!principal.isAdmin && input.user_id !== undefined && input.user_id !== principal.userId) {
      throw new NotFoundError('user not found');
    }
    const userId = principal.isAdmin ? input.user_id : principal.userId;
    return this.store.usageReport(principal.tenantId, {
      from: input.from,
      to: input.to,
      groupBy: input.group_by,
      ...(userId === undefined ? {} : { userId }),
    });
  }
}
