/**
 * A remote agent for tests of the `http` agent: a node:http server that
 * checks each request's signature with its own copy of the secret (401 when
 * it does not verify, as a real remote agent must), records what arrived,
 * and answers with what the test's handler writes: NDJSON lines, raw bytes,
 * pauses, a status, or a connection it never ends.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { SIGNATURE_HEADER, TIMESTAMP_HEADER, verifyRequestSignature } from '@cs/agents';
import {
  closeServer,
  jsonBody,
  listenLocally,
  localOrigin,
  readRequest,
} from './fake-server-http.js';

export interface RemoteAgentRequest {
  headers: IncomingMessage['headers'];
  raw: string;
  body: Record<string, unknown>;
  /** Whether the signature verified with the server's secret. */
  verified: boolean;
  /** Resolves when the connection closed (ms, Date.now()). */
  closed: Promise<number>;
}

/** Writes the answer; the response is ended after it unless it returns (or resolves to) 'hang'. */
export type RemoteAgentHandler = (request: RemoteAgentRequest, answer: RemoteAnswer) => unknown;

export class RemoteAnswer {
  constructor(readonly res: ServerResponse) {}

  start(status = 200): void {
    if (this.res.headersSent) return;
    this.res.writeHead(status, { 'content-type': 'application/x-ndjson' });
    this.res.flushHeaders();
  }

  /** Writes each value as one JSON line. */
  lines(...values: unknown[]): void {
    this.start();
    this.res.write(values.map((value) => `${JSON.stringify(value)}\n`).join(''));
  }

  raw(text: string | Buffer): void {
    this.start();
    this.res.write(text);
  }

  get closed(): boolean {
    return this.res.destroyed;
  }
}

export class FakeRemoteAgent {
  readonly requests: RemoteAgentRequest[] = [];
  private readonly server: Server;

  private constructor(
    private readonly secret: string,
    private handler: RemoteAgentHandler,
  ) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  static async start(secret: string, handler: RemoteAgentHandler): Promise<FakeRemoteAgent> {
    const agent = new FakeRemoteAgent(secret, handler);
    await listenLocally(agent.server);
    return agent;
  }

  get url(): string {
    return `${localOrigin(this.server)}/agent`;
  }

  answerWith(handler: RemoteAgentHandler): void {
    this.handler = handler;
  }

  close(): Promise<void> {
    return closeServer(this.server);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { raw, closed } = await readRequest(req, res);
    const header = (name: string) => {
      const value = req.headers[name];
      return Array.isArray(value) ? value[0] : value;
    };
    const verified = verifyRequestSignature(
      this.secret,
      header(TIMESTAMP_HEADER),
      raw,
      header(SIGNATURE_HEADER),
    );
    const request: RemoteAgentRequest = {
      headers: req.headers,
      raw,
      body: jsonBody(raw),
      verified,
      closed,
    };
    this.requests.push(request);
    if (!verified) {
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end('{"error":"bad signature"}');
      return;
    }
    const answer = new RemoteAnswer(res);
    const outcome: unknown = await this.handler(request, answer);
    if (outcome === 'hang' || res.destroyed) return;
    answer.start();
    res.end();
  }
}

export function pause(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
