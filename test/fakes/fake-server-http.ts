/**
 * The node:http plumbing the fake servers share: listening on a free port of
 * 127.0.0.1, closing with every connection still open, and reading a request
 * whole with a promise of when its connection closed (what tests of
 * cancellation wait on).
 */
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A request as a fake model server records it. */
export interface RecordedRequest {
  path: string;
  headers: IncomingMessage['headers'];
  body: Record<string, unknown>;
  /** Resolves when the client has closed the connection (or the response ended). */
  closed: Promise<number>;
  /** When the request arrived (ms, Date.now()). */
  at: number;
}

export function listenLocally(server: Server): Promise<void> {
  return new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
}

/** `http://127.0.0.1:<port>` of a listening server. */
export function localOrigin(server: Server): string {
  const { port } = server.address() as AddressInfo;
  return `http://127.0.0.1:${port}`;
}

/** Closes the server without waiting for its clients (streams held open included). */
export async function closeServer(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

/** Reads the body whole; `closed` resolves with the time the response's connection closed. */
export async function readRequest(
  req: IncomingMessage,
  res: ServerResponse,
): Promise<{ raw: string; closed: Promise<number> }> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  let markClosed!: (at: number) => void;
  const closed = new Promise<number>((resolve) => (markClosed = resolve));
  res.on('close', () => markClosed(Date.now()));
  return { raw: Buffer.concat(chunks).toString('utf8'), closed };
}

/** The body as JSON, or `{}` when it is not JSON (the test sees what arrived). */
export function jsonBody(raw: string): Record<string, unknown> {
  try {
    return JSON.parse(raw) as Record<string, unknown>;
  } catch {
    return {};
  }
}

/** Reads and records a request to a fake model server (OpenAI-compatible or Anthropic). */
export async function recordRequest(
  req: IncomingMessage,
  res: ServerResponse,
): Promise<RecordedRequest> {
  const { raw, closed } = await readRequest(req, res);
  return { path: req.url ?? '', headers: req.headers, body: jsonBody(raw), closed, at: Date.now() };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
