import { Controller, Get, Header, Inject, Res } from '@nestjs/common';
import { ApiExcludeController } from '@nestjs/swagger';
import type { Response } from 'express';
import { READINESS_CHECKS } from '../tokens.js';
import { LifecycleService, type ReadinessCheck } from './lifecycle.service.js';
import { ServiceMetrics, unreachableDependencies } from '@cs/observability';

/** `/healthz`, `/readyz` and `/metrics`, outside `/api` and unauthenticated. */
@ApiExcludeController()
@Controller()
export class HealthController {
  constructor(
    private readonly lifecycle: LifecycleService,
    @Inject(READINESS_CHECKS) private readonly checks: ReadinessCheck[],
    @Inject(ServiceMetrics) private readonly metrics: ServiceMetrics,
  ) {}

  @Get('healthz')
  health(): { status: 'ok' } {
    return { status: 'ok' };
  }

  @Get('readyz')
  async ready(@Res() response: Response): Promise<void> {
    if (this.lifecycle.draining) {
      response.status(503).json({ error: { code: 'UNAVAILABLE', message: 'draining' } });
      return;
    }
    // Each check gives up after READINESS_TIMEOUT_MS: a hung dependency is an unreachable one.
    const failures = await unreachableDependencies(this.checks);
    if (this.lifecycle.draining) {
      response.status(503).json({ error: { code: 'UNAVAILABLE', message: 'draining' } });
      return;
    }
    if (failures.length > 0) {
      response
        .status(503)
        .json({ error: { code: 'UNAVAILABLE', message: `unreachable: ${failures.join(', ')}` } });
      return;
    }
    response.status(200).json({ status: 'ready' });
  }

  @Get('metrics')
  @Header('cache-control', 'no-store')
  async prometheus(@Res() response: Response): Promise<void> {
    response.type(this.metrics.registry.contentType).send(await this.metrics.registry.metrics());
  }
}
