/**
 * A local model server for tests: speaks OpenAI Chat Completions streaming
 * and Anthropic Messages streaming over real HTTP (node:http), as the real
 * APIs send them, from a script of replies the test writes. It records every
 * request (body and headers) and when the client closed each connection, so
 * tests can check retries, cancellation and what the agent sent.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AppConfig } from '@cs/config';
import { sleep } from './fake-server-http.js';
import { ScriptedModelServer } from './scripted-model-server.js';

export type { RecordedRequest } from './fake-server-http.js';

/** One server-sent event: `data` is JSON-encoded unless it is a string. */
export interface SseEvent {
  event?: string;
  data: unknown;
}

/** How the server answers one request. */
export type FakeReply =
  | {
      kind: 'stream';
      events: SseEvent[];
      /** Pause before each event. */
      delayMs?: number;
      /** After the events, destroy the socket without ending the response. */
      cut?: boolean;
      /** After the events, keep the response open until the client goes away. */
      hang?: boolean;
    }
  | { kind: 'json'; status: number; body: unknown; headers?: Record<string, string> };

/** Answers by the rules of `when` first, then from the queue of `reply`, then `always`'s reply. */
export class FakeModelServer extends ScriptedModelServer<FakeReply> {
  private readonly replies: FakeReply[] = [];
  private fallback: FakeReply | undefined;

  static start(): Promise<FakeModelServer> {
    return new FakeModelServer().listen();
  }

  /** Queues replies, answered in order; past them, `always`'s reply or a 500. */
  reply(...replies: FakeReply[]): this {
    this.replies.push(...replies);
    return this;
  }

  always(reply: FakeReply): this {
    this.fallback = reply;
    return this;
  }

  protected async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { body } = await this.record(req, res);
    const reply = this.ruleFor(body) ??
      this.replies.shift() ??
      this.fallback ?? { kind: 'json', status: 500, body: { error: 'no reply scripted' } };
    if (reply.kind === 'json') {
      res.writeHead(reply.status, { 'content-type': 'application/json', ...reply.headers });
      res.end(JSON.stringify(reply.body));
      return;
    }
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    res.flushHeaders();
    for (const event of reply.events) {
      if (reply.delayMs) await sleep(reply.delayMs);
      if (res.destroyed) return;
      const data = typeof event.data === 'string' ? event.data : JSON.stringify(event.data);
      res.write(`${event.event ? `event: ${event.event}\n` : ''}data: ${data}\n\n`);
    }
    if (reply.cut) {
      // Let the written chunks reach the client before the connection drops.
      await sleep(20);
      res.socket?.destroy();
      return;
    }
    if (reply.hang) return;
    res.end();
  }
}

/** The llm settings of an agent of `server` as an OpenAI-compatible API (no prices unless given). */
export function fakeModelLlmConfig(
  server: FakeModelServer,
  apiKey: string,
  overrides: Partial<AppConfig['llm']> = {},
): AppConfig['llm'] {
  return {
    provider: 'openai',
    baseUrl: `${server.url}/v1`,
    apiKey,
    model: 'fake-model',
    models: ['fake-model'],
    timeoutMs: 10_000,
    maxRetries: 2,
    prices: {},
    contextTokens: 10_000,
    maxOutputTokens: 4096,
    ...overrides,
  };
}

// ------------------------------------------------------------ OpenAI streams

interface OpenAiToolCallScript {
  id: string;
  name: string;
  /** The arguments' JSON text, in the pieces the stream sends it in. */
  argumentPieces: string[];
}

/**
 * A Chat Completions stream as OpenAI sends it: a role chunk, content
 * pieces, tool calls (name first, arguments split across chunks), the
 * finish reason, a usage chunk with no choices (`stream_options.include_usage`),
 * then `[DONE]`. `finish: false` leaves the finish reason, usage and `[DONE]` out.
 */
export function openAiStream(script: {
  text?: string[];
  toolCalls?: OpenAiToolCallScript[];
  usage?: { prompt_tokens: number; completion_tokens: number; cost?: number };
  finish?: boolean;
  model?: string;
}): SseEvent[] {
  const base = {
    id: 'chatcmpl-fake',
    object: 'chat.completion.chunk',
    created: 1_700_000_000,
    model: script.model ?? 'fake-model',
  };
  const chunk = (delta: Record<string, unknown>, finish_reason: string | null = null) => ({
    data: { ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason }] },
  });
  const events: SseEvent[] = [chunk({ role: 'assistant', content: '' })];
  for (const piece of script.text ?? []) events.push(chunk({ content: piece }));
  (script.toolCalls ?? []).forEach((call, index) => {
    events.push(
      chunk({
        tool_calls: [
          { index, id: call.id, type: 'function', function: { name: call.name, arguments: '' } },
        ],
      }),
    );
    for (const piece of call.argumentPieces) {
      events.push(chunk({ tool_calls: [{ index, function: { arguments: piece } }] }));
    }
  });
  if (script.finish === false) return events;
  events.push(chunk({}, script.toolCalls?.length ? 'tool_calls' : 'stop'));
  if (script.usage) {
    events.push({
      data: {
        ...base,
        choices: [],
        usage: {
          ...script.usage,
          total_tokens: script.usage.prompt_tokens + script.usage.completion_tokens,
        },
      },
    });
  }
  events.push({ data: '[DONE]' });
  return events;
}

/** A non-streamed Chat Completions answer (for the title request). */
export function openAiCompletion(
  text: string,
  usage = { prompt_tokens: 20, completion_tokens: 4 },
) {
  return {
    id: 'chatcmpl-fake',
    object: 'chat.completion',
    created: 1_700_000_000,
    model: 'fake-model',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: text },
        logprobs: null,
        finish_reason: 'stop',
      },
    ],
    usage: { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens },
  };
}

// ---------------------------------------------------------- Anthropic streams

/**
 * A Messages stream as Anthropic sends it: `message_start` (input tokens),
 * a text block of `text_delta`s, `tool_use` blocks whose input arrives as
 * `input_json_delta` pieces, a ping, `message_delta` (stop reason, output
 * tokens) and `message_stop`. `finish: false` leaves the last two out.
 */
export function anthropicStream(script: {
  text?: string[];
  toolUses?: OpenAiToolCallScript[];
  usage?: { input_tokens: number; output_tokens: number };
  finish?: boolean;
}): SseEvent[] {
  const usage = script.usage ?? { input_tokens: 10, output_tokens: 5 };
  const events: SseEvent[] = [
    {
      event: 'message_start',
      data: {
        type: 'message_start',
        message: {
          id: 'msg_fake',
          type: 'message',
          role: 'assistant',
          content: [],
          model: 'fake-claude',
          stop_reason: null,
          stop_sequence: null,
          usage: { input_tokens: usage.input_tokens, output_tokens: 1 },
        },
      },
    },
  ];
  let index = 0;
  if (script.text?.length) {
    events.push({
      event: 'content_block_start',
      data: { type: 'content_block_start', index, content_block: { type: 'text', text: '' } },
    });
    events.push({ event: 'ping', data: { type: 'ping' } });
    for (const piece of script.text) {
      events.push({
        event: 'content_block_delta',
        data: { type: 'content_block_delta', index, delta: { type: 'text_delta', text: piece } },
      });
    }
    events.push({ event: 'content_block_stop', data: { type: 'content_block_stop', index } });
    index += 1;
  }
  for (const use of script.toolUses ?? []) {
    events.push({
      event: 'content_block_start',
      data: {
        type: 'content_block_start',
        index,
        content_block: { type: 'tool_use', id: use.id, name: use.name, input: {} },
      },
    });
    for (const piece of use.argumentPieces) {
      events.push({
        event: 'content_block_delta',
        data: {
          type: 'content_block_delta',
          index,
          delta: { type: 'input_json_delta', partial_json: piece },
        },
      });
    }
    events.push({ event: 'content_block_stop', data: { type: 'content_block_stop', index } });
    index += 1;
  }
  if (script.finish === false) return events;
  events.push({
    event: 'message_delta',
    data: {
      type: 'message_delta',
      delta: {
        stop_reason: script.toolUses?.length ? 'tool_use' : 'end_turn',
        stop_sequence: null,
      },
      usage: { output_tokens: usage.output_tokens },
    },
  });
  events.push({ event: 'message_stop', data: { type: 'message_stop' } });
  return events;
}
