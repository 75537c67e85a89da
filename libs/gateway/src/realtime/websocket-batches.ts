/**
 * One system call for each batch of packets that Engine.IO hands a WebSocket
 * at once, instead of one per packet. Engine.IO queues the packets that come
 * while a write is in flight (the rest of a turn's events, which arrive
 * together) and flushes them together. The WebSocket transport then writes
 * each one as a frame of its own, and each frame is a socket write. Corked for
 * the tick, those frames leave in one write: `ws` corks around each frame, and
 * nested corks only take effect at the outermost uncork.
 */
import type { Socket as NetSocket } from 'node:net';
import type { Server } from 'socket.io';

/** An Engine.IO connection, as far as batching needs it. */
interface EngineConnection {
  /** True once a polling connection moved to a WebSocket: its request's socket is then another. */
  upgraded: boolean;
  transport: { name: string };
  /** The request that opened the connection; for a WebSocket from the start, the upgrade. */
  request: { socket: NetSocket | null };
}

export function writeWebSocketBatchesAtOnce(server: Server): void {
  server.engine.on('flush', (connection: EngineConnection, packets: readonly unknown[]) => {
    if (packets.length < 2 || connection.upgraded || connection.transport.name !== 'websocket') {
      return;
    }
    const socket = connection.request.socket;
    if (!socket || socket.destroyed) return;
    socket.cork();
    process.nextTick(() => socket.uncork());
  });
}
