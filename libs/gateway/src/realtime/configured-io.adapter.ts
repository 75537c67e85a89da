import type { INestApplicationContext } from '@nestjs/common';
import { IoAdapter } from '@nestjs/platform-socket.io';
import type { IncomingMessage } from 'node:http';
import type { Server, ServerOptions } from 'socket.io';
import { HANDSHAKE_TIMEOUT_MS, PendingHandshakes } from './pending-handshakes.js';
import { writeWebSocketBatchesAtOnce } from './websocket-batches.js';

/**
 * Socket.IO with the operator's origin policy, and a bound on connections
 * that never finish their handshake (`PendingHandshakes`): a browser page of another
 * origin may open a socket only when `CORS_ORIGINS` names it (WebSockets
 * are not covered by CORS, so the `Origin` header is checked here). Clients
 * that send no `Origin` (servers, SDKs in Node) are let in. Packets queued
 * for a WebSocket go out in one write (`writeWebSocketBatchesAtOnce`).
 */
export class ConfiguredIoAdapter extends IoAdapter {
  constructor(
    app: INestApplicationContext,
    private readonly corsOrigins: readonly string[],
  ) {
    super(app);
  }

  override createIOServer(port: number, options?: ServerOptions): Server {
    const allowed = new Set(this.corsOrigins);
    const pending = new PendingHandshakes();
    const configured = {
      ...options,
      connectTimeout: HANDSHAKE_TIMEOUT_MS,
      allowRequest: (request: IncomingMessage, callback: (error: null, ok: boolean) => void) =>
        callback(null, originAllowed(request, allowed) && pending.admits(request)),
      ...(allowed.size > 0 ? { cors: { origin: [...allowed] } } : {}),
    };
    const server: Server = super.createIOServer(port, configured as ServerOptions);
    countPendingHandshakes(server, pending);
    writeWebSocketBatchesAtOnce(server);
    return server;
  }
}

/** An Engine.IO connection, as far as the count needs it. */
interface EngineConnection {
  request: IncomingMessage;
  once(event: 'close', listener: () => void): unknown;
}

/** Each Engine.IO connection is pending from its opening until it joins or closes. */
function countPendingHandshakes(server: Server, pending: PendingHandshakes): void {
  const settles = new WeakMap<object, () => void>();
  server.engine.on('connection', (connection: EngineConnection) => {
    const settle = pending.open(connection.request);
    settles.set(connection, settle);
    connection.once('close', settle);
  });
  server.on('connection', (socket) => settles.get(socket.conn)?.());
}

/** Same-origin pages, named origins, and clients without an `Origin` header. */
export function originAllowed(request: IncomingMessage, allowed: ReadonlySet<string>): boolean {
  const origin = request.headers.origin;
  if (origin === undefined || allowed.has(origin)) return true;
  try {
    return new URL(origin).host === request.headers.host;
  } catch {
    return false;
  }
}
