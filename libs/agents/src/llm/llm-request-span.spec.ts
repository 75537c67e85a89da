// The `model request` spans of the llm agent, with the OpenTelemetry SDK
// started as tracing.sdk.ts starts it (exporting in memory), against the
// local OpenAI-compatible server.
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { withSpan } from '@cs/observability';
import { useInMemoryTracing } from '../../../../test/support/in-memory-tracing.js';
import { contextOf, events, resetEventIds, settle } from '../../../../test/fakes/agent-context.js';
import {
  FakeModelServer,
  fakeModelLlmConfig,
  openAiCompletion,
  openAiStream,
} from '../../../../test/fakes/fake-model-server.js';
import { LlmAgent } from './llm.agent.js';

const API_KEY = 'sk-span-test-THE-KEY-0123456789';
const USER_TEXT = 'my confidential question 5d1e';
const ANSWER_TEXT = 'a confidential answer 9c2b';

const { exporter, finished } = useInMemoryTracing();
let server: FakeModelServer;

beforeEach(async () => {
  resetEventIds();
  exporter.reset();
  durations.length = 0;
  server = await FakeModelServer.start();
});
afterEach(() => server.close());

const durations: number[] = [];

function agent(): LlmAgent {
  const llm = fakeModelLlmConfig(server, API_KEY);
  return new LlmAgent(
    { llm, model: 'fake-model', temperature: undefined, toolNames: undefined },
    { backoffMs: 10, maxBackoffMs: 20, onRequestEnded: (seconds) => durations.push(seconds) },
  );
}

const requestSpans = (spans: ReadableSpan[]) => spans.filter((s) => s.name === 'model request');

describe('LlmAgent model request spans', () => {
  it('makes one span per model request, a child of the agent step, with counts and no content or key', async () => {
    server.reply(
      { kind: 'json', status: 429, body: { error: { message: `slow ${API_KEY}` } } },
      {
        kind: 'stream',
        events: openAiStream({
          text: [ANSWER_TEXT],
          usage: { prompt_tokens: 120, completion_tokens: 7 },
        }),
      },
    );
    const context = contextOf([events.user(USER_TEXT)], { instructions: 'secret instructions' });
    const run = await withSpan('agent step', () => settle(agent().step(context)));
    expect(run.error).toBeUndefined();

    const spans = await finished();
    const step = spans.find((s) => s.name === 'agent step')!;
    const requests = requestSpans(spans);
    expect(requests).toHaveLength(2);
    for (const span of requests) {
      expect(span.spanContext().traceId).toBe(step.spanContext().traceId);
      expect(span.parentSpanContext?.spanId).toBe(step.spanContext().spanId);
      expect(span.attributes).toMatchObject({
        'gen_ai.provider.name': 'openai',
        'gen_ai.request.model': 'fake-model',
        'cs.llm.purpose': 'step',
      });
    }
    const [retried, answered] = requests;
    expect(retried!.attributes).toMatchObject({ 'cs.llm.attempt': 1, 'cs.llm.outcome': 'retried' });
    expect(retried!.status.code).toBe(2); // SpanStatusCode.ERROR
    expect(answered!.attributes).toMatchObject({
      'cs.llm.attempt': 2,
      'cs.llm.outcome': 'ok',
      'gen_ai.usage.input_tokens': 120,
      'gen_ai.usage.output_tokens': 7,
      'gen_ai.response.finish_reasons': ['stop'],
    });
    const seen = JSON.stringify(
      requests.map((s) => ({ a: s.attributes, st: s.status, ev: s.events })),
    );
    for (const secret of [API_KEY, USER_TEXT, ANSWER_TEXT, 'secret instructions', 'slow'])
      expect(seen).not.toContain(secret);
    // Each request is timed once, for cs_llm_request_seconds.
    expect(durations).toHaveLength(2);
    for (const seconds of durations) expect(seconds).toBeGreaterThan(0);
  });

  it('ends the span of a request the runtime stops reading as aborted', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({ text: ['one', 'two'], finish: false }),
      hang: true,
    });
    const steps = agent().step(contextOf([events.user(USER_TEXT)]));
    const iterator = steps[Symbol.asyncIterator]();
    await withSpan('agent step', async () => {
      expect((await iterator.next()).value).toEqual({ type: 'delta', delta: 'one' });
      await iterator.return?.();
    });
    const [span] = requestSpans(await finished());
    expect(span?.attributes['cs.llm.outcome']).toBe('aborted');
    expect(span?.status.code).not.toBe(2);
  });

  it('makes a span of the title request', async () => {
    server.reply({ kind: 'json', status: 200, body: openAiCompletion('A title') });
    const context = contextOf([events.user(USER_TEXT), events.agent(ANSWER_TEXT)]);
    await agent().title(context);
    const [span] = requestSpans(await finished());
    expect(span?.attributes).toMatchObject({ 'cs.llm.purpose': 'title', 'cs.llm.outcome': 'ok' });
    expect(durations).toHaveLength(1);
    expect(JSON.stringify(span?.attributes)).not.toContain(USER_TEXT);
    expect(JSON.stringify(span?.attributes)).not.toContain(ANSWER_TEXT);
  });
});
