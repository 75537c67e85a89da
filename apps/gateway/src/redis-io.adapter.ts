import type { INestApplicationContext } from '@nestjs/common';
import { createAdapter } from '@socket.io/redis-adapter';
import { ConfiguredIoAdapter } from '@cs/gateway';
import type { RedisConnection } from '@cs/cluster';
import type { Server, ServerOptions } from 'socket.io';

/**
 * Socket.IO on the classic Redis adapter: rooms and server-side emits span
 * every gateway, and workers reach them through the Redis emitter (same key).
 */
export class RedisIoAdapter extends ConfiguredIoAdapter {
  constructor(
    app: INestApplicationContext,
    corsOrigins: readonly string[],
    private readonly pub: RedisConnection,
    private readonly sub: RedisConnection,
    private readonly key: string,
  ) {
    super(app, corsOrigins);
  }

  override createIOServer(port: number, options?: ServerOptions): Server {
    const server: Server = super.createIOServer(port, options);
    server.adapter(createAdapter(this.pub, this.sub, { key: this.key }));
    return server;
  }
}
