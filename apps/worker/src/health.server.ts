import { createServer, type Server } from 'node:http';
import type { Registry } from 'prom-client';
import { unreachableDependencies, type ReadinessCheck } from '@cs/observability';

export interface WorkerHealthSource {
  workerId: string;
  conversations(): string[];
  draining(): boolean;
  /** Postgres and Redis; each gives up after READINESS_TIMEOUT_MS. */
  checks: readonly ReadinessCheck[];
  registry: Registry;
}

/**
 * The worker's internal port: `/healthz` (its id and the conversations it
 * holds), `/readyz` (503 while draining or when a dependency is down) and
 * `/metrics`. Not for the public ingress.
 */
export function startHealthServer(
  port: number,
  host: string,
  source: WorkerHealthSource,
): Promise<Server> {
  const server = createServer((request, response) => {
    const send = (status: number, body: unknown, type = 'application/json') => {
      response.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      response.end(type === 'application/json' ? JSON.stringify(body) : String(body));
    };
    const path = (request.url ?? '/').split('?')[0];
    if (request.method !== 'GET')
      return send(404, { error: { code: 'NOT_FOUND', message: 'not found' } });
    if (path === '/healthz') {
      return send(200, {
        status: 'ok',
        worker_id: source.workerId,
        conversations: source.conversations(),
      });
    }
    if (path === '/readyz') {
      if (source.draining())
        return send(503, { error: { code: 'UNAVAILABLE', message: 'draining' } });
      unreachableDependencies(source.checks).then(
        (failures) => {
          if (source.draining()) send(503, { error: { code: 'UNAVAILABLE', message: 'draining' } });
          else if (failures.length > 0)
            send(503, {
              error: { code: 'UNAVAILABLE', message: `unreachable: ${failures.join(', ')}` },
            });
          else send(200, { status: 'ready' });
        },
        () => send(503, { error: { code: 'UNAVAILABLE', message: 'readiness check failed' } }),
      );
      return;
    }
    if (path === '/metrics') {
      source.registry.metrics().then(
        (text) => send(200, text, source.registry.contentType),
        () => send(503, { error: { code: 'UNAVAILABLE', message: 'metrics unavailable' } }),
      );
      return;
    }
    send(404, { error: { code: 'NOT_FOUND', message: 'not found' } });
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}
