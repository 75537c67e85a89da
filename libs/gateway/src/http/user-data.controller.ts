import {
  Controller,
  Logger,
  Delete,
  Get,
  HttpCode,
  Param,
  Query,
  Res,
  UseGuards,
} from '@nestjs/common';
import { ApiBearerAuth, ApiOkResponse, ApiTags } from '@nestjs/swagger';
import type { Response } from 'express';
import { NotFoundError } from '@cs/core';
import {
  AuditPageSchema,
  AuditQuerySchema,
  ConversationIdSchema,
  ErasureStartedSchema,
  ErasureStatusSchema,
  UserIdParamSchema,
  type AuditPageView,
  type ErasureStarted,
  type ErasureStatusView,
} from '@cs/protocol';
import { CurrentPrincipal, HttpAuthGuard } from '../auth/http-auth.guard.js';
import type { Principal } from '../auth/principal.js';
import { cutShort, streamNdjson } from '../lifecycle/ndjson-response.js';
import { UserDataService } from '../lifecycle/user-data.service.js';
import { openApiSchema } from './openapi.js';
import { parseInput } from './validation.js';

function userParam(raw: string): string {
  return parseInput(UserIdParamSchema, raw);
}

/** docs/protocol.md "Data lifecycle": `/api/users/:user_id` (erasure, export). */
@ApiTags('data lifecycle')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/users')
export class UsersController {
  private readonly logger = new Logger(UsersController.name);

  constructor(private readonly users: UserDataService) {}

  @Delete(':user_id')
  @HttpCode(202)
  @ApiOkResponse({ schema: openApiSchema(ErasureStartedSchema) })
  erase(
    @CurrentPrincipal() principal: Principal,
    @Param('user_id') userId: string,
  ): Promise<ErasureStarted> {
    return this.users.erase(principal, userParam(userId));
  }

  /** NDJSON: every conversation of the user as its export, then `{ user_state }`. */
  @Get(':user_id/export')
  async export(
    @CurrentPrincipal() principal: Principal,
    @Param('user_id') userId: string,
    @Res() response: Response,
  ): Promise<void> {
    const subject = userParam(userId);
    await streamNdjson(
      response,
      async (sink) => {
        await this.users.exportUser(principal, subject, sink);
      },
      cutShort(this.logger),
    );
  }
}

@ApiTags('data lifecycle')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/erasures')
export class ErasuresController {
  constructor(private readonly users: UserDataService) {}

  @Get(':erasure_id')
  @ApiOkResponse({ schema: openApiSchema(ErasureStatusSchema) })
  get(
    @CurrentPrincipal() principal: Principal,
    @Param('erasure_id') erasureId: string,
  ): Promise<ErasureStatusView> {
    if (!ConversationIdSchema.safeParse(erasureId).success) throw new NotFoundError();
    return this.users.erasure(principal, erasureId);
  }
}

@ApiTags('data lifecycle')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/audit')
export class AuditController {
  constructor(private readonly users: UserDataService) {}

  @Get()
  @ApiOkResponse({ schema: openApiSchema(AuditPageSchema) })
  list(@CurrentPrincipal() principal: Principal, @Query() query: unknown): Promise<AuditPageView> {
    return this.users.audit(principal, parseInput(AuditQuerySchema, query));
  }
}
