import type { INestApplicationContext } from '@nestjs/common';
import { createShardedAdapter } from '@socket.io/redis-adapter';
import { ConfiguredIoAdapter } from '@cs/gateway';
import type { Cluster, Redis } from 'ioredis';
import type { Server, ServerOptions } from 'socket.io';

/**
 * Socket.IO on the sharded Redis adapter (`SPUBLISH`/`SSUBSCRIBE`, Redis 7 or
 * later, one Redis or a Cluster): what is asked of a room (presence's
 * `fetchSockets`, a deleted conversation's status and close) reaches every
 * gateway. `static` subscription mode: every gateway subscribes to the
 * adapter's one channel (and its own response channel) once, instead of a
 * channel per room, which would cost an `SSUBSCRIBE` and an `SUNSUBSCRIBE`
 * for each conversation a gateway has sockets of (one room per
 * conversation), and would put a room's emits on another channel than its
 * `disconnectSockets`, which then could overtake them. The conversations'
 * live traffic does not go through the adapter: it has its own channels
 * (libs/cluster/src/realtime).
 */
export class RedisIoAdapter extends ConfiguredIoAdapter {
  constructor(
    app: INestApplicationContext,
    corsOrigins: readonly string[],
    private readonly pub: Redis | Cluster,
    private readonly sub: Redis | Cluster,
    private readonly key: string,
  ) {
    super(app, corsOrigins);
  }

  override createIOServer(port: number, options?: ServerOptions): Server {
    const server: Server = super.createIOServer(port, options);
    server.adapter(
      createShardedAdapter(this.pub, this.sub, {
        channelPrefix: this.key,
        subscriptionMode: 'static',
      }),
    );
    return server;
  }
}
