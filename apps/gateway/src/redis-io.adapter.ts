import type { INestApplicationContext } from '@nestjs/common';
import { IoAdapter } from '@nestjs/platform-socket.io';
import { RedisAdapter } from '@socket.io/redis-adapter';
import type { Redis } from 'ioredis';
import type { Namespace, Server, ServerOptions } from 'socket.io';

type BroadcastOptions = Parameters<RedisAdapter['disconnectSockets']>[0];

/**
 * Socket.IO on the classic Redis adapter: rooms and server-side emits span
 * every gateway, and workers reach them through the Redis emitter (same key).
 */
export class RedisIoAdapter extends IoAdapter {
  constructor(
    app: INestApplicationContext,
    private readonly pub: Redis,
    private readonly sub: Redis,
    private readonly key: string,
  ) {
    super(app);
  }

  override createIOServer(port: number, options?: ServerOptions): Server {
    const server = super.createIOServer(port, options);
    const { pub, sub, key } = this;
    server.adapter(
      class extends GatewayRedisAdapter {
        constructor(nsp: Namespace) {
          super(nsp, pub, sub, { key });
        }
      },
    );
    return server;
  }
}

/**
 * The Redis adapter turns `disconnectSockets` into a request to every gateway,
 * so a draining gateway's "close my sockets" (`server.disconnectSockets(true)`
 * in ConversationGateway.disconnectAll) would close every client of the
 * cluster. A gateway only ever means its own sockets: their clients then
 * reconnect to another replica, while the other replicas' clients stay.
 */
class GatewayRedisAdapter extends RedisAdapter {
  override disconnectSockets(opts: BroadcastOptions, close: boolean): void {
    super.disconnectSockets({ ...opts, flags: { ...opts.flags, local: true } }, close);
  }
}
