import type { INestApplicationContext } from '@nestjs/common';
import { IoAdapter } from '@nestjs/platform-socket.io';
import type { IncomingMessage } from 'node:http';
import type { Server, ServerOptions } from 'socket.io';

/**
 * Socket.IO with the operator's origin policy: a browser page of another
 * origin may open a socket only when `CORS_ORIGINS` names it (WebSockets
 * are not covered by CORS, so the `Origin` header is checked here). Clients
 * that send no `Origin` (servers, SDKs in Node) are let in.
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
    const configured = {
      ...options,
      allowRequest: (request: IncomingMessage, callback: (error: null, ok: boolean) => void) =>
        callback(null, originAllowed(request, allowed)),
      ...(allowed.size > 0 ? { cors: { origin: [...allowed] } } : {}),
    };
    return super.createIOServer(port, configured as ServerOptions);
  }
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
