/**
 * What the fake model servers (OpenAI-compatible and Anthropic) share: a
 * node:http server on 127.0.0.1, every request recorded with when its
 * connection closed, and replies from rules the test writes (first match
 * wins). Each subclass speaks its API in `handle`.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import {
  closeServer,
  listenLocally,
  localOrigin,
  recordRequest,
  type RecordedRequest,
} from './fake-server-http.js';

type Match = (body: Record<string, unknown>) => boolean;

export abstract class ScriptedModelServer<Reply> {
  readonly requests: RecordedRequest[] = [];
  private readonly server: Server;
  private readonly rules: { match: Match; reply: Reply }[] = [];

  protected constructor() {
    this.server = createServer((req, res) => {
      void this.handle(req, res).catch(() => res.destroy());
    });
  }

  /** The base URL of the server (`http://127.0.0.1:<port>`). */
  get url(): string {
    return localOrigin(this.server);
  }

  /** Answers every request whose body matches with `reply` (rules in the order given). */
  when(match: Match, reply: Reply): this {
    this.rules.push({ match, reply });
    return this;
  }

  /** Requests that streamed (steps), leaving out the others (titles). */
  get streamed(): RecordedRequest[] {
    return this.requests.filter((request) => request.body['stream'] === true);
  }

  close(): Promise<void> {
    return closeServer(this.server);
  }

  protected async listen(): Promise<this> {
    await listenLocally(this.server);
    return this;
  }

  /** Reads the request whole and records it (a body that is not JSON as {}). */
  protected async record(req: IncomingMessage, res: ServerResponse): Promise<RecordedRequest> {
    const request = await recordRequest(req, res);
    this.requests.push(request);
    return request;
  }

  /** The reply of the first rule that matches `body`, if any. */
  protected ruleFor(body: Record<string, unknown>): Reply | undefined {
    return this.rules.find((rule) => rule.match(body))?.reply;
  }

  protected abstract handle(req: IncomingMessage, res: ServerResponse): Promise<void>;
}
