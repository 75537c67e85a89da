import { Injectable } from '@nestjs/common';

/** A dependency check for `/readyz`: resolves when reachable, throws otherwise. */
export type { ReadinessCheck } from '@cs/observability';

/** Whether this process is draining: `/readyz` answers 503 from the first signal on. */
@Injectable()
export class LifecycleService {
  private drainingSince: number | undefined;

  get draining(): boolean {
    return this.drainingSince !== undefined;
  }

  startDraining(): void {
    this.drainingSince ??= Date.now();
  }
}
