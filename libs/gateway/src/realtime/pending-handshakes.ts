/**
 * Engine.IO connections that have not yet joined the namespace (sent their
 * Socket.IO CONNECT and been let in), counted per remote address. Such a
 * connection holds memory and a file descriptor before anything is checked:
 * it is closed after `HANDSHAKE_TIMEOUT_MS` (Socket.IO's `connectTimeout`),
 * and one address may hold at most `MAX_PENDING_HANDSHAKES_PER_ADDRESS` at
 * once (more are refused before the Engine.IO handshake). A client's own
 * connection waits here for milliseconds, so a proxy's address in front of
 * many clients stays far below the cap.
 */
import type { IncomingMessage } from 'node:http';

/** How long a connection may take to send its CONNECT and be let in. */
export const HANDSHAKE_TIMEOUT_MS = 5_000;
export const MAX_PENDING_HANDSHAKES_PER_ADDRESS = 128;

export class PendingHandshakes {
  private readonly byAddress = new Map<string, number>();

  constructor(private readonly maxPerAddress = MAX_PENDING_HANDSHAKES_PER_ADDRESS) {}

  /** Whether a new connection from the address of `request` may begin its handshake. */
  admits(request: IncomingMessage): boolean {
    return (this.byAddress.get(addressOf(request)) ?? 0) < this.maxPerAddress;
  }

  /** Counts a connection from the address of `request`; the function returned settles it (once). */
  open(request: IncomingMessage): () => void {
    const address = addressOf(request);
    this.byAddress.set(address, (this.byAddress.get(address) ?? 0) + 1);
    let settled = false;
    return () => {
      if (settled) return;
      settled = true;
      const left = (this.byAddress.get(address) ?? 1) - 1;
      if (left > 0) this.byAddress.set(address, left);
      else this.byAddress.delete(address);
    };
  }

  /** Connections still waiting, from `address`. */
  pendingFrom(address: string): number {
    return this.byAddress.get(address) ?? 0;
  }
}

function addressOf(request: IncomingMessage): string {
  return request.socket.remoteAddress ?? '';
}
