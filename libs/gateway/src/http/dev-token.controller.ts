import { Body, Controller, Post } from '@nestjs/common';
import { ApiBody, ApiTags } from '@nestjs/swagger';
import { NotFoundError } from '@cs/core';
import { DevTokenBodySchema } from '@cs/protocol';
import { TokenService } from '../auth/token.service.js';
import { openApiSchema } from './openapi.js';
import { parseInput } from './validation.js';

export const DEV_USER_ID = 'demo-user';
export const DEV_TENANT_ID = 'demo-tenant';

/** `POST /api/dev/token`: development tokens, only when `AUTH_DEV_TOKENS` is on. */
@ApiTags('development')
@Controller('api/dev')
export class DevTokenController {
  constructor(private readonly tokens: TokenService) {}

  @Post('token')
  @ApiBody({ schema: openApiSchema(DevTokenBodySchema) })
  async issue(@Body() body: unknown): Promise<{ token: string }> {
    if (!this.tokens.devTokensEnabled) throw new NotFoundError('not found');
    const input = parseInput(DevTokenBodySchema, body ?? {});
    const token = await this.tokens.issueDevToken({
      userId: input.user_id ?? DEV_USER_ID,
      tenantId: input.tenant_id ?? DEV_TENANT_ID,
      roles: input.roles ?? [],
    });
    return { token };
  }
}
