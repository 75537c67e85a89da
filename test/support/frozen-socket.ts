// A Socket.IO client that connects to a conversation and then freezes, as a
// process stopped with kill -STOP or with its event loop blocked: it speaks
// just enough of the protocol over a raw TCP connection (the WebSocket
// upgrade, then Socket.IO's CONNECT with the token), then never reads nor
// answers again, the close frame of a server that disconnects it included.
// The kernel still takes what the server sends, as it would for a frozen one.
import { connect, type Socket } from 'node:net';

/** A client frame: FIN + text, masked (with a zero key: clients must mask, any key will do). */
function textFrame(text: string): Buffer {
  const payload = Buffer.from(text);
  if (payload.length > 0xffff) throw new Error('frame too long for this client');
  const head =
    payload.length < 126
      ? Buffer.from([0x81, 0x80 | payload.length])
      : Buffer.from([0x81, 0x80 | 126, payload.length >> 8, payload.length & 0xff]);
  return Buffer.concat([head, Buffer.alloc(4), payload]);
}

/**
 * Opens a conversation socket on `baseUrl` (`http://host:port`) and freezes it
 * once the server accepted it. Destroy the returned socket when done.
 */
export async function openFrozenSocket(
  baseUrl: string,
  token: string,
  query: Record<string, string>,
): Promise<Socket> {
  const url = new URL(baseUrl);
  const search = new URLSearchParams({ ...query, EIO: '4', transport: 'websocket' });
  const socket = connect(Number(url.port), url.hostname);
  let received = '';
  let connectSent = false;
  try {
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.once('close', () => reject(new Error(`closed before connecting: ${received}`)));
      socket.once('connect', () =>
        socket.write(
          [
            `GET /socket.io/?${search.toString()} HTTP/1.1`,
            `Host: ${url.host}`,
            'Upgrade: websocket',
            'Connection: Upgrade',
            'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==',
            'Sec-WebSocket-Version: 13',
            '',
            '',
          ].join('\r\n'),
        ),
      );
      // Frames from the server are not masked: their text can be read in the bytes as they come.
      socket.on('data', (chunk: Buffer) => {
        received += chunk.toString('latin1');
        if (!received.startsWith('HTTP/1.1 101')) return reject(new Error(received));
        if (!connectSent && received.includes('0{"sid"')) {
          connectSent = true;
          socket.write(textFrame(`40${JSON.stringify({ token })}`));
        } else if (received.includes('44{')) {
          reject(new Error(`connection refused: ${received}`));
        } else if (received.includes('40{"sid"')) {
          resolve();
        }
      });
    });
  } catch (error) {
    socket.destroy();
    throw error;
  }
  socket.removeAllListeners('data');
  socket.removeAllListeners('close');
  socket.on('error', () => undefined); // a reset from the server, unread: nothing to report
  socket.pause();
  return socket;
}
