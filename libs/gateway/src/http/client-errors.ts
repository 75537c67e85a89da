// Requests Node's HTTP parser refuses before the app sees them. Node's own
// answer to headers (or a query string) over `maxHeaderSize` is a bare 431
// with no body; the contract's is a JSON error like every other. Whatever else
// the parser refuses (malformed requests, timeouts) gets Node's usual answer.
// Either way the answer is written on the socket, which is then closed.
import { maxHeaderSize, STATUS_CODES, type ServerResponse, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ErrorBody } from '@cs/protocol';

const HEADERS_TOO_LARGE: ErrorBody = {
  error: {
    code: 'BAD_REQUEST',
    message: `the request's headers, query string included, are larger than ${Math.floor(maxHeaderSize / 1024)} KiB`,
  },
};

/** Answers what the HTTP parser refuses on `server` (instead of Node's default). */
export function answerClientErrors(server: Server): void {
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (socket.writable && !responseStarted(socket)) socket.write(responseTo(error));
    socket.destroy();
  });
}

function responseTo(error: NodeJS.ErrnoException): string {
  switch (error.code) {
    case 'HPE_HEADER_OVERFLOW':
      return raw(400, 'application/json', JSON.stringify(HEADERS_TOO_LARGE));
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return raw(413);
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return raw(408);
    default:
      return raw(400);
  }
}

function raw(status: number, contentType?: string, body = ''): string {
  const lines = [`HTTP/1.1 ${status} ${STATUS_CODES[status]}`, 'Connection: close'];
  if (contentType) lines.push(`Content-Type: ${contentType}; charset=utf-8`);
  if (body) lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  return `${lines.join('\r\n')}\r\n\r\n${body}`;
}

/**
 * Whether a response on this connection has begun (a stream, a pipelined
 * request's answer): writing another then would corrupt it. Node's default
 * handler makes the same check through the same field.
 */
function responseStarted(socket: Duplex): boolean {
  const current = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage;
  return current?.headersSent === true;
}
