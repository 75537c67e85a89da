import type { INestApplicationContext } from '@nestjs/common';
import { createShardedAdapter } from '@socket.io/redis-adapter';
import { StartupError } from '@cs/config';
import { ConfiguredIoAdapter } from '@cs/gateway';
import type { RedisConnection } from '@cs/cluster';
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
    private readonly pub: RedisConnection,
    private readonly sub: RedisConnection,
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

/**
 * Sharded pub/sub came with Redis 7.0: on an older Redis the adapter's first
 * `SSUBSCRIBE` would fail, so the start is refused with one line instead.
 * A Redis that does not answer `INFO` is let through.
 */
export async function checkShardedPubSub(
  redis: Pick<RedisConnection, 'info'>,
  variable: string,
): Promise<void> {
  let info: string;
  try {
    info = await redis.info('server');
  } catch {
    return;
  }
  const version = /^redis_version:(\d+)\.([\d.]+)/m.exec(info);
  if (version && Number(version[1]) < 7) {
    throw new StartupError(
      `${variable}: Redis ${version[1]}.${version[2]} has no sharded pub/sub, which the gateway's Socket.IO adapter needs: use Redis 7.0 or later`,
    );
  }
}
