import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo, Socket as NetSocket } from 'node:net';
import { Server } from 'socket.io';
import { io, type Socket as ClientSocket } from 'socket.io-client';
import { afterEach, describe, expect, it } from 'vitest';
import { writeWebSocketBatchesAtOnce } from './websocket-batches.js';

/** Counts what a socket hands to the operating system: each `_write` or `_writev` is one write. */
function countWrites(socket: NetSocket): { writes: number } {
  const count = { writes: 0 };
  const stream = socket as NetSocket & {
    _write: (...args: unknown[]) => void;
    _writev: (...args: unknown[]) => void;
  };
  const write = stream._write.bind(stream);
  const writev = stream._writev.bind(stream);
  stream._write = (...args) => {
    count.writes += 1;
    write(...args);
  };
  stream._writev = (...args) => {
    count.writes += 1;
    writev(...args);
  };
  return count;
}

describe(writeWebSocketBatchesAtOnce.name, () => {
  let http: HttpServer;
  let server: Server;
  let client: ClientSocket | null = null;

  afterEach(async () => {
    client?.close();
    client = null;
    await server.close();
  });

  /**
   * A server that, once a WebSocket client connects, emits `count` events in
   * one tick: the first is written at once, the rest queue behind it and
   * reach the transport together. Resolves with the events the client got and
   * the server socket's writes while they went out.
   */
  async function emitInOneTick(
    count: number,
    batched: boolean,
  ): Promise<{ received: number[]; writes: number }> {
    http = createServer();
    server = new Server(http);
    if (batched) writeWebSocketBatchesAtOnce(server);
    await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve));
    const { port } = http.address() as AddressInfo;
    let counted: { writes: number } | null = null;
    server.on('connection', (socket) => {
      socket.on('go', () => {
        counted = countWrites(socket.request.socket);
        for (let i = 0; i < count; i += 1) socket.emit('event', i);
      });
    });
    const received: number[] = [];
    const all = new Promise<void>((resolve) => {
      client = io(`http://127.0.0.1:${port}`, { transports: ['websocket'] });
      client.on('event', (i: number) => {
        received.push(i);
        if (received.length === count) resolve();
      });
      client.on('connect', () => client?.emit('go'));
    });
    await all;
    return { received, writes: counted!.writes };
  }

  it('writes the events queued behind a write in flight to a WebSocket in one write, in order', async () => {
    const { received, writes } = await emitInOneTick(6, true);
    expect(received).toEqual([0, 1, 2, 3, 4, 5]);
    // The first alone, the five queued behind it together.
    expect(writes).toBe(2);
  });

  it('is what Engine.IO does not do by itself: a write per event', async () => {
    const { received, writes } = await emitInOneTick(6, false);
    expect(received).toEqual([0, 1, 2, 3, 4, 5]);
    expect(writes).toBe(6);
  });
});
