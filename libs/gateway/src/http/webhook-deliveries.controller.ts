import {
  Body,
  Controller,
  Get,
  HttpCode,
  Inject,
  Optional,
  Param,
  Post,
  Query,
  UseGuards,
} from '@nestjs/common';
import { ApiBearerAuth, ApiTags } from '@nestjs/swagger';
import { ConflictError, NotFoundError, type WebhookDelivery, type WebhookOutbox } from '@cs/core';
import {
  EmptyBodySchema,
  ListWebhookDeliveriesQuerySchema,
  type WebhookDeliveryInfo,
  type WebhookDeliveryPage,
} from '@cs/protocol';
import { CurrentPrincipal, HttpAuthGuard } from '../auth/http-auth.guard.js';
import type { Principal } from '../auth/principal.js';
import { WEBHOOK_OUTBOX } from '../tokens.js';
import { parseInput } from './validation.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * The webhook deliveries of the caller's tenant (docs/protocol.md "Webhooks"),
 * for an `admin` only: to anyone else the routes do not exist (404), as a
 * conversation of another user does not.
 */
@ApiTags('webhooks')
@ApiBearerAuth()
@UseGuards(HttpAuthGuard)
@Controller('api/webhook-deliveries')
export class WebhookDeliveriesController {
  constructor(@Optional() @Inject(WEBHOOK_OUTBOX) private readonly outbox?: WebhookOutbox) {}

  @Get()
  async list(
    @CurrentPrincipal() principal: Principal,
    @Query() query: unknown,
  ): Promise<WebhookDeliveryPage> {
    const outbox = this.outboxFor(principal);
    const input = parseInput(ListWebhookDeliveriesQuerySchema, query);
    const page = await outbox.listDeliveries({
      tenantId: principal.tenantId,
      limit: input.limit,
      ...(input.status ? { status: input.status } : {}),
      ...(input.page_id ? { cursor: input.page_id } : {}),
    });
    return { results: page.items.map(toInfo), next_page_id: page.nextCursor };
  }

  @Post(':id/retry')
  @HttpCode(200)
  async retry(
    @CurrentPrincipal() principal: Principal,
    @Param('id') id: string,
    @Body() body: unknown,
  ): Promise<WebhookDeliveryInfo> {
    const outbox = this.outboxFor(principal);
    if (!UUID.test(id)) throw new NotFoundError('webhook delivery not found');
    parseInput(EmptyBodySchema, body ?? {});
    const retried = await outbox.retryDelivery(principal.tenantId, id);
    if (retried === 'not_found') throw new NotFoundError('webhook delivery not found');
    if (retried === 'not_failed') throw new ConflictError('only a failed delivery is sent again');
    return toInfo(retried);
  }

  private outboxFor(principal: Principal): WebhookOutbox {
    if (!principal.isAdmin || !this.outbox) throw new NotFoundError('not found');
    return this.outbox;
  }
}

function toInfo(delivery: WebhookDelivery): WebhookDeliveryInfo {
  return {
    id: delivery.id,
    type: delivery.type,
    conversation_id: delivery.conversationId,
    endpoint_url: delivery.endpointUrl,
    status: delivery.status,
    attempts: delivery.attempts,
    last_error: delivery.lastError,
    created_at: delivery.createdAt.toISOString(),
    delivered_at: delivery.deliveredAt?.toISOString() ?? null,
  };
}
