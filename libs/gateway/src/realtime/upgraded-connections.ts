// The connections the HTTP server handed over to Socket.IO (WebSocket
// upgrades), while they are open, so that a drain can cut those whose client
// does not close its side. Telling a socket to disconnect sends a WebSocket
// close frame and waits for the client's answer, and the HTTP server's close
// waits for every connection: a client that is frozen (kill -STOP, a blocked
// event loop) or has stopped reading never answers, and held each drain to its
// deadline (ws itself waits 30 s). Node's `closeAllConnections()` leaves
// upgraded connections alone, hence this list.
import type { IncomingMessage, Server } from 'node:http';
import type { Duplex } from 'node:stream';

export class UpgradedConnections {
  private readonly open = new Set<Duplex>();

  constructor(server: Server) {
    // One more listener beside Socket.IO's: Node hands the socket to each.
    server.on('upgrade', (_request: IncomingMessage, socket: Duplex) => {
      if (socket.destroyed) return;
      this.open.add(socket);
      socket.once('close', () => this.open.delete(socket));
    });
  }

  /** How many are open. */
  get size(): number {
    return this.open.size;
  }

  /** Destroys every upgraded connection still open; returns how many there were. */
  destroyAll(): number {
    const count = this.open.size;
    for (const socket of this.open) socket.destroy();
    this.open.clear();
    return count;
  }
}
