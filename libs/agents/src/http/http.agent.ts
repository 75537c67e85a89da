/**
 * The `http` agent (docs/protocol.md "HTTP agent"): a remote agent in any
 * language. Each step is one signed POST to `AGENT_HTTP_URL` with the
 * conversation's context; the answer is NDJSON, one agent output per line,
 * yielded as each line arrives. A line that is not an agent output becomes
 * an `error` observation and the step goes on. A non-2xx answer, a silence
 * longer than `AGENT_HTTP_TIMEOUT_MS` (before the headers or between two
 * chunks), an answer over 10 MiB, or one cut short ends the turn in
 * `agent_http_error`. The `idempotency-key` is the conversation and the id
 * of the last stored event of the step's history, the agent state changes
 * left out: a new holder stores `loading` and `running` before it repeats
 * the step of a holder that died, and the repeat must carry the same key.
 */
import type { ReadableStreamDefaultReader, ReadableStreamReadResult } from 'node:stream/web';
import { AgentTurnError, type Agent, type AgentContext } from '@cs/core';
import { AgentOutputSchema, type AgentOutput, type StoredEvent } from '@cs/protocol';
import { NdjsonLines } from './ndjson-lines.js';
import { SIGNATURE_HEADER, TIMESTAMP_HEADER, signRequest } from './request-signature.js';

export const HTTP_AGENT = 'http';
/** Events sent with each request (`events`: the last ones stored, oldest first). */
export const HTTP_AGENT_EVENTS = 100;
export const HTTP_AGENT_MAX_BYTES = 10 * 1024 * 1024;

/** The media type of an answer (docs/protocol.md "HTTP agent"). */
const NDJSON = 'application/x-ndjson';

export interface HttpAgentSettings {
  url: string;
  secret: string;
  /** The longest silence: before the answer's headers, and between two of its chunks. */
  timeoutMs: number;
  /** The most the answer may hold (default 10 MiB). */
  maxBytes?: number;
  /** The conversation's `agent_config`, sent with each step (default `{}`). */
  agentConfig?: Record<string, unknown>;
}

export class HttpAgent implements Agent {
  private readonly maxBytes: number;

  constructor(private readonly settings: HttpAgentSettings) {
    this.maxBytes = settings.maxBytes ?? HTTP_AGENT_MAX_BYTES;
  }

  async *step(context: AgentContext): AsyncIterable<AgentOutput> {
    const events = await context.history.recent(HTTP_AGENT_EVENTS);
    const body = JSON.stringify({
      conversation_id: context.conversation_id,
      tenant_id: context.tenant_id,
      user_id: context.user_id,
      trigger: context.trigger,
      events,
      state: context.state,
      instructions: context.instructions,
      tools: context.tools,
      agent_config: this.settings.agentConfig ?? {},
    });
    const timestamp = String(Math.floor(Date.now() / 1000));

    const silence = new SilenceTimer(this.settings.timeoutMs);
    const own = new AbortController();
    const signal = AbortSignal.any([context.signal, silence.signal, own.signal]);
    const fail = (why: string, cause?: unknown): never => {
      if (context.signal.aborted) throw abortReason(context.signal);
      if (silence.signal.aborted) {
        throw new AgentTurnError(
          'agent_http_error',
          `the remote agent was silent for longer than ${this.settings.timeoutMs} ms`,
          { cause },
        );
      }
      throw new AgentTurnError('agent_http_error', why, { cause });
    };

    try {
      let response: Response;
      try {
        response = await fetch(this.settings.url, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            accept: NDJSON,
            [TIMESTAMP_HEADER]: timestamp,
            [SIGNATURE_HEADER]: signRequest(this.settings.secret, timestamp, body),
            'idempotency-key': `${context.conversation_id}:${stepHistoryEnd(context, events)}`,
          },
          body,
          signal,
          // A redirect is an answer that is not 2xx: the URL comes from configuration only.
          redirect: 'manual',
        });
      } catch (error) {
        return fail('the remote agent cannot be reached', error);
      }
      silence.reset();
      if (!response.ok || !response.body) {
        await response.body?.cancel().catch(() => undefined);
        return fail(`the remote agent answered with status ${response.status}`);
      }
      // Not an agent's answer (a proxy's page, a wrong URL): its lines are no outputs.
      const type = response.headers.get('content-type')?.split(';')[0]?.trim().toLowerCase();
      if (type !== NDJSON) {
        await response.body.cancel().catch(() => undefined);
        return fail(`the remote agent answered ${type || 'without a content type'}, not ${NDJSON}`);
      }

      // fetch's body is typed loosely: its chunks are bytes.
      const reader = response.body.getReader() as ReadableStreamDefaultReader<Uint8Array>;
      const decoder = new TextDecoder();
      const lines = new NdjsonLines();
      let received = 0;
      let lineNumber = 0;
      for (;;) {
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (error) {
          return fail("the remote agent's answer was cut short", error);
        }
        let complete: string[];
        if (chunk.done) {
          complete = [...lines.push(decoder.decode()), ...lines.end()];
        } else {
          received += chunk.value.byteLength;
          if (received > this.maxBytes) {
            return fail(`the remote agent's answer exceeds ${this.maxBytes} bytes`);
          }
          complete = lines.push(decoder.decode(chunk.value, { stream: true }));
        }
        // The silence is the remote agent's: the time the runtime takes with an output is not.
        silence.clear();
        for (const line of complete) {
          lineNumber += 1;
          if (line.trim() === '') continue;
          yield parseLine(line, lineNumber);
        }
        silence.reset();
        if (chunk.done) return;
      }
    } finally {
      silence.clear();
      // Closes the connection when the runtime stops reading mid-answer.
      own.abort();
    }
  }
}

/**
 * The id of the last event of the step's history that is not an agent
 * state change (those say where a holder is, not what the agent was told).
 * The trigger is always in the history: the key never goes back past it.
 */
export function stepHistoryEnd(context: AgentContext, events: readonly StoredEvent[]): number {
  for (let i = events.length - 1; i >= 0; i -= 1) {
    const event = events[i]!;
    if ('observation' in event && event.observation === 'agent_state_changed') continue;
    return Math.max(event.id, context.trigger.id);
  }
  return context.trigger.id;
}

/** One answer line as an agent output, or the `error` observation saying why it is not one. */
export function parseLine(line: string, lineNumber: number): AgentOutput {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch {
    return errorObservation(`line ${lineNumber} of the remote agent's answer is not JSON`);
  }
  const parsed = AgentOutputSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  const where = issue && issue.path.length > 0 ? `${issue.path.join('.')}: ` : '';
  return errorObservation(
    `line ${lineNumber} of the remote agent's answer is not an agent output (${where}${issue?.message ?? 'invalid'})`,
  );
}

function errorObservation(why: string): AgentOutput {
  return { type: 'event', body: { observation: 'error', content: why, extras: {}, message: why } };
}

/** Aborts its signal once `ms` pass without a `reset()`. */
class SilenceTimer {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number) {
    this.reset();
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  reset(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.controller.abort(new Error('silence')), this.ms);
  }

  clear(): void {
    clearTimeout(this.timer);
  }
}

function abortReason(signal: AbortSignal): Error {
  return signal.reason instanceof Error
    ? signal.reason
    : new Error('aborted', { cause: signal.reason });
}
