/**
 * A local Anthropic Messages API for tests, beside the OpenAI-compatible
 * `FakeModelServer`: real HTTP (node:http) at `POST /v1/messages` only, the
 * key checked as Anthropic does (`x-api-key`, and `anthropic-version`
 * required), errors in Anthropic's `{ type: "error", error }` shape, and
 * streams of the Messages API's SSE events (`anthropicStream`). Each event
 * is written in two TCP writes split inside its JSON, so the client's SSE
 * parser must assemble lines as a real network delivers them. Replies come
 * from rules the test writes (first match wins); a request no rule matches
 * is answered with a 500. Every request is recorded with when its
 * connection closed.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { SseEvent } from './fake-model-server.js';
import { sleep } from './fake-server-http.js';
import { ScriptedModelServer } from './scripted-model-server.js';

export { anthropicStream } from './fake-model-server.js';

export const ANTHROPIC_VERSION = '2023-06-01';

export type AnthropicReply =
  | {
      kind: 'stream';
      events: SseEvent[];
      /** Pause before each event. */
      delayMs?: number;
      /** After the events, keep the response open until the client goes away. */
      hang?: boolean;
    }
  | { kind: 'message'; text: string; usage?: { input_tokens: number; output_tokens: number } }
  | { kind: 'error'; status: number; type: string; message: string };

/** The base URL (`LLM_BASE_URL`) is `url`: requests go to `<url>/v1/messages`. */
export class FakeAnthropicServer extends ScriptedModelServer<AnthropicReply> {
  private constructor(private readonly apiKey: string) {
    super();
  }

  static start(options: { apiKey: string }): Promise<FakeAnthropicServer> {
    return new FakeAnthropicServer(options.apiKey).listen();
  }

  protected async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // A body that is not JSON is recorded as {}, and answered below as an invalid request.
    const { body } = await this.record(req, res);

    if (req.method !== 'POST' || (req.url ?? '').split('?')[0] !== '/v1/messages') {
      return error(res, 404, 'not_found_error', 'Not found');
    }
    if (req.headers['x-api-key'] !== this.apiKey) {
      return error(res, 401, 'authentication_error', 'invalid x-api-key');
    }
    if (req.headers['anthropic-version'] !== ANTHROPIC_VERSION) {
      return error(res, 400, 'invalid_request_error', 'anthropic-version header is required');
    }
    if (typeof body['model'] !== 'string' || !Array.isArray(body['messages'])) {
      return error(res, 400, 'invalid_request_error', 'model and messages are required');
    }
    const reply = this.ruleFor(body) ?? {
      kind: 'error',
      status: 500,
      type: 'api_error',
      message: 'no reply scripted',
    };
    if (reply.kind === 'error') return error(res, reply.status, reply.type, reply.message);
    if (reply.kind === 'message') {
      res.writeHead(200, { 'content-type': 'application/json', 'request-id': 'req_fake' });
      res.end(JSON.stringify(anthropicMessage(reply.text, reply.usage, body['model'])));
      return;
    }
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'request-id': 'req_fake',
    });
    res.flushHeaders();
    for (const event of reply.events) {
      if (reply.delayMs) await sleep(reply.delayMs);
      if (res.destroyed) return;
      const data = typeof event.data === 'string' ? event.data : JSON.stringify(event.data);
      const text = `${event.event ? `event: ${event.event}\n` : ''}data: ${data}\n\n`;
      // Two writes, the second after a pause: the client sees half an event first.
      const half = Math.floor(text.length / 2);
      res.write(text.slice(0, half));
      await sleep(2);
      if (res.destroyed) return;
      res.write(text.slice(half));
    }
    if (reply.hang) return;
    res.end();
  }
}

function error(res: ServerResponse, status: number, type: string, message: string): void {
  res.writeHead(status, { 'content-type': 'application/json', 'request-id': 'req_fake' });
  res.end(JSON.stringify({ type: 'error', error: { type, message } }));
}

/** A non-streamed Messages answer (for the title request). */
export function anthropicMessage(
  text: string,
  usage = { input_tokens: 20, output_tokens: 4 },
  model: unknown = 'fake-claude',
) {
  return {
    id: 'msg_fake_title',
    type: 'message',
    role: 'assistant',
    model: typeof model === 'string' ? model : 'fake-claude',
    content: [{ type: 'text', text }],
    stop_reason: 'end_turn',
    stop_sequence: null,
    usage,
  };
}
