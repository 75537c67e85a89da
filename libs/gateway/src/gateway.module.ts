import { Module, type DynamicModule, type Provider } from '@nestjs/common';
import { HttpAuthGuard } from './auth/http-auth.guard.js';
import { TokenService } from './auth/token.service.js';
import { ConversationCreation } from './conversations/conversation-creation.service.js';
import { ConversationService } from './conversations/conversation.service.js';
import { UserActionDelivery } from './conversations/user-action-delivery.service.js';
import { ConversationsController } from './http/conversations.controller.js';
import { BranchingController } from './http/branching.controller.js';
import { ConversationBranchingService } from './conversations/conversation-branching.service.js';
import { DevTokenController } from './http/dev-token.controller.js';
import { UsageController } from './http/usage.controller.js';
import { WebhookDeliveriesController } from './http/webhook-deliveries.controller.js';
import { HealthController } from './observability/health.controller.js';
import { LifecycleService } from './observability/lifecycle.service.js';
import { ConversationRoomHub } from './realtime/conversation-room-hub.js';
import { ConversationSockets } from './realtime/conversation-sockets.js';
import { UserStreamRegistry } from './realtime/user-stream.registry.js';
import { ConversationGateway } from './realtime/conversation.gateway.js';
import { EventStreamService } from './realtime/event-stream.service.js';
import { ConnectionLimiter } from './realtime/connection-limiter.js';
import { TurnWatchService } from './realtime/turn-watch.service.js';
import { ErasureRunner } from './lifecycle/erasure.runner.js';
import { RetentionSweeper } from './lifecycle/retention.sweeper.js';
import { UserDataService } from './lifecycle/user-data.service.js';
import {
  AuditController,
  ErasuresController,
  UsersController,
} from './http/user-data.controller.js';

/**
 * The client-facing edge shared by the gateway and the standalone app: REST,
 * Socket.IO, SSE, auth, health and metrics. The host app provides the ports:
 * `APP_CONFIG`, `CONVERSATION_STORE`, `CONVERSATION_MANAGER`,
 * `USER_ACTION_RATE_LIMITER`, `AGENT_FACTORY`, `READINESS_CHECKS`,
 * `DATA_LIFECYCLE_STORE` and `ServiceMetrics` (optional: `RETENTION_LOCK`,
 * `USER_KEY_ERASER`).
 */
@Module({})
export class GatewayModule {
  static forRoot(ports: Provider[]): DynamicModule {
    return {
      module: GatewayModule,
      controllers: [
        ConversationsController,
        BranchingController,
        DevTokenController,
        HealthController,
        UsageController,
        WebhookDeliveriesController,
        UsersController,
        ErasuresController,
        AuditController,
      ],
      providers: [
        ...ports,
        TokenService,
        HttpAuthGuard,
        ConversationService,
        ConversationCreation,
        UserActionDelivery,
        ConversationBranchingService,
        ConversationRoomHub,
        ConversationSockets,
        UserStreamRegistry,
        ConversationGateway,
        EventStreamService,
        LifecycleService,
        ConnectionLimiter,
        TurnWatchService,
        ErasureRunner,
        RetentionSweeper,
        UserDataService,
      ],
      exports: [
        ConversationRoomHub,
        ConversationGateway,
        EventStreamService,
        TurnWatchService,
        LifecycleService,
        TokenService,
        UserDataService,
      ],
    };
  }
}
