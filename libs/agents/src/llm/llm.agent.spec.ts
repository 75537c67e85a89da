import { inspect } from 'node:util';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { AgentTurnError } from '@cs/core';
import type { AppConfig } from '@cs/config';
import {
  CURRENT_TIME_TOOL,
  contextOf,
  events,
  resetEventIds,
  settle,
} from '../../../../test/fakes/agent-context.js';
import {
  FakeModelServer,
  anthropicStream,
  fakeModelLlmConfig,
  openAiCompletion,
  openAiStream,
} from '../../../../test/fakes/fake-model-server.js';
import { LLM_RETRY_STATUS, LlmAgent } from './llm.agent.js';
import { cleanTitle } from './llm-title.js';
import { EMPTY_RESULT, EMPTY_USER_MESSAGE } from './prompt-messages.js';

const API_KEY = 'sk-test-THE-KEY-0123456789';

let server: FakeModelServer;

beforeEach(async () => {
  resetEventIds();
  server = await FakeModelServer.start();
});

afterEach(async () => {
  vi.unstubAllEnvs();
  await server.close();
});

function agent(overrides: Partial<AppConfig['llm']> = {}, toolNames?: string[]): LlmAgent {
  const llm = fakeModelLlmConfig(server, API_KEY, {
    prices: { 'fake-model': { input: 2, output: 10 } },
    ...overrides,
  });
  return new LlmAgent(
    { llm, model: llm.model!, temperature: undefined, toolNames },
    { backoffMs: 20, maxBackoffMs: 50 },
  );
}

const askTime = () => contextOf([events.user('What time is it?')], { tools: [CURRENT_TIME_TOOL] });

describe(`${LlmAgent.name} on an OpenAI-compatible server`, () => {
  it('streams deltas, then usage with the cost from LLM_PRICES, then the final message', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({
        text: ['Hel', 'lo, ', 'world'],
        usage: { prompt_tokens: 1000, completion_tokens: 500 },
      }),
    });
    const context = contextOf([events.user('Say hello')], { instructions: 'Be brief.' });
    const { outputs, error } = await settle(agent().step(context));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'delta', delta: 'Hel' },
      { type: 'delta', delta: 'lo, ' },
      { type: 'delta', delta: 'world' },
      // 1000 × $2/M + 500 × $10/M
      { type: 'usage', prompt_tokens: 1000, completion_tokens: 500, cost_usd: 0.007 },
      { type: 'message', content: 'Hello, world' },
    ]);
    const request = server.requests[0]!;
    expect(request.path).toBe('/v1/chat/completions');
    expect(request.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(request.body).toMatchObject({
      model: 'fake-model',
      stream: true,
      stream_options: { include_usage: true },
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Say hello' },
      ],
    });
  });

  it('sends no key for a server that takes none, and reads none from the environment', async () => {
    vi.stubEnv('OPENAI_API_KEY', 'sk-from-the-environment');
    vi.stubEnv('OPENAI_ORG_ID', 'org-from-the-environment');
    server.reply({ kind: 'stream', events: openAiStream({ text: ['hi'] }) });
    const { outputs, error } = await settle(
      agent({ apiKey: undefined }).step(contextOf([events.user('hello')])),
    );
    expect(error).toBeUndefined();
    expect(outputs.at(-1)).toEqual({ type: 'message', content: 'hi' });
    const { headers } = server.requests[0]!;
    expect(headers.authorization).toBeUndefined();
    expect(headers['openai-organization']).toBeUndefined();
  });

  it('yields a delta while the model is still streaming', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({ text: ['first'], finish: false }),
      hang: true,
    });
    const controller = new AbortController();
    const context = contextOf([events.user('hi')], { signal: controller.signal });
    const iterator = agent().step(context)[Symbol.asyncIterator]();
    const first = await iterator.next();
    expect(first.value).toEqual({ type: 'delta', delta: 'first' });
    // The server has not ended the response: the delta came from the open stream.
    let closed = false;
    void server.requests[0]!.closed.then(() => (closed = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(closed).toBe(false);
    controller.abort();
    await expect(iterator.next()).rejects.toBeDefined();
  });

  it('uses the provider-reported cost when the usage chunk has one', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({
        text: ['ok'],
        usage: { prompt_tokens: 10, completion_tokens: 2, cost: 0.5 },
      }),
    });
    const { outputs } = await settle(agent().step(contextOf([events.user('hi')])));
    expect(outputs).toContainEqual({
      type: 'usage',
      prompt_tokens: 10,
      completion_tokens: 2,
      cost_usd: 0.5,
    });
  });

  it('leaves the cost out for a model without a price', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({ text: ['ok'], usage: { prompt_tokens: 10, completion_tokens: 2 } }),
    });
    const { outputs } = await settle(agent({ prices: {} }).step(contextOf([events.user('hi')])));
    expect(outputs).toContainEqual({ type: 'usage', prompt_tokens: 10, completion_tokens: 2 });
  });

  it('turns tool calls whose arguments arrive split across chunks into tool_call outputs', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({
        text: ['Let me look.'],
        toolCalls: [
          { id: 'call_time', name: 'current_time', argumentPieces: ['{', '}'] },
          {
            id: 'call_weather',
            name: 'weather__forecast',
            argumentPieces: ['{"ci', 'ty": "Par', 'is", "days"', ': 3}'],
          },
        ],
        usage: { prompt_tokens: 50, completion_tokens: 20 },
      }),
    });
    const tools = [
      CURRENT_TIME_TOOL,
      {
        name: 'weather__forecast',
        description: 'forecast',
        parameters: {
          type: 'object',
          properties: { city: { type: 'string' }, days: { type: 'number' } },
        },
      },
    ];
    const { outputs, error } = await settle(
      agent().step(contextOf([events.user('time and weather?')], { tools })),
    );
    expect(error).toBeUndefined();
    expect(outputs.filter((o) => o.type !== 'delta' && o.type !== 'usage')).toEqual([
      { type: 'tool_call', tool: 'current_time', arguments: {}, tool_call_id: 'call_time' },
      {
        type: 'tool_call',
        tool: 'weather__forecast',
        arguments: { city: 'Paris', days: 3 },
        tool_call_id: 'call_weather',
      },
    ]);
    expect(outputs.some((o) => o.type === 'message')).toBe(false);
    const sent = server.requests[0]!.body['tools'] as { function: { name: string } }[];
    expect(sent.map((t) => t.function.name)).toEqual(['current_time', 'weather__forecast']);
  });

  it('assembles tool calls from servers that leave out their index', async () => {
    const stream = openAiStream({
      toolCalls: [
        { id: 'call_a', name: 'current_time', argumentPieces: ['{"zone"', ': "UTC"}'] },
        { id: 'call_b', name: 'current_time', argumentPieces: ['{}'] },
      ],
    });
    for (const event of stream) {
      const data = event.data as { choices?: { delta?: { tool_calls?: { index?: number }[] } }[] };
      for (const piece of data.choices?.[0]?.delta?.tool_calls ?? []) delete piece.index;
    }
    server.reply({ kind: 'stream', events: stream });
    const { outputs, error } = await settle(agent().step(askTime()));
    expect(error).toBeUndefined();
    expect(outputs.filter((o) => o.type === 'tool_call')).toEqual([
      {
        type: 'tool_call',
        tool: 'current_time',
        arguments: { zone: 'UTC' },
        tool_call_id: 'call_a',
      },
      { type: 'tool_call', tool: 'current_time', arguments: {}, tool_call_id: 'call_b' },
    ]);
  });

  it('passes on a call of a tool it does not know, for the runtime to answer with an error', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({
        toolCalls: [{ id: 'call_x', name: 'no such tool!', argumentPieces: ['not json'] }],
      }),
    });
    const { outputs, error } = await settle(agent().step(askTime()));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'tool_call', tool: 'no_such_tool_', arguments: {}, tool_call_id: 'call_x' },
    ]);
  });

  it('offers only the tools agent_config.tools names', async () => {
    server.reply({ kind: 'stream', events: openAiStream({ text: ['ok'] }) });
    const tools = [CURRENT_TIME_TOOL, { ...CURRENT_TIME_TOOL, name: 'set_state' }];
    await settle(agent({}, ['set_state']).step(contextOf([events.user('hi')], { tools })));
    const sent = server.requests[0]!.body['tools'] as { function: { name: string } }[];
    expect(sent.map((t) => t.function.name)).toEqual(['set_state']);
  });

  it('never offers a tool whose name providers refuse (a module may name one so): every request would fail', async () => {
    server.reply({ kind: 'stream', events: openAiStream({ text: ['ok'] }) });
    const tools = [
      CURRENT_TIME_TOOL,
      { ...CURRENT_TIME_TOOL, name: 'files.read' },
      { ...CURRENT_TIME_TOOL, name: 'n'.repeat(65) },
    ];
    await settle(agent().step(contextOf([events.user('hi')], { tools })));
    const sent = server.requests[0]!.body['tools'] as { function: { name: string } }[];
    expect(sent.map((t) => t.function.name)).toEqual(['current_time']);
  });

  it('sends the stored history as model messages: tool calls with their results', async () => {
    server.reply({ kind: 'stream', events: openAiStream({ text: ['It is noon.'] }) });
    const history = [
      events.user('What time is it?'),
      events.stateChanged('running'),
      events.toolCall('current_time', {}, 'call_1'),
      events.toolResult('current_time', '2026-01-01T12:00:00Z', 'call_1'),
    ];
    const { outputs } = await settle(
      agent().step(contextOf(history, { tools: [CURRENT_TIME_TOOL] })),
    );
    expect(outputs.at(-1)).toEqual({ type: 'message', content: 'It is noon.' });
    expect(server.requests[0]!.body['messages']).toEqual([
      { role: 'user', content: 'What time is it?' },
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'call_1', type: 'function', function: { name: 'current_time', arguments: '{}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'call_1', content: '2026-01-01T12:00:00Z' },
    ]);
  });

  it('retries a 429 after its retry-after and a 500, announcing each retry, then answers', async () => {
    server.reply(
      {
        kind: 'json',
        status: 429,
        body: { error: { message: 'Rate limit reached for org-secret' } },
        headers: { 'retry-after': '1' },
      },
      { kind: 'json', status: 500, body: { error: { message: 'upstream exploded' } } },
      { kind: 'stream', events: openAiStream({ text: ['finally'] }) },
    );
    const context = contextOf([events.user('hi')]);
    const { outputs, error } = await settle(agent().step(context));
    expect(error).toBeUndefined();
    expect(outputs.at(-1)).toEqual({ type: 'message', content: 'finally' });
    expect(server.requests).toHaveLength(3);
    expect(server.requests[1]!.at - server.requests[0]!.at).toBeGreaterThanOrEqual(950);
    expect(context.statuses).toEqual([
      { type: 'info', id: LLM_RETRY_STATUS, message: 'retrying the model request' },
      { type: 'info', id: LLM_RETRY_STATUS, message: 'retrying the model request' },
    ]);
  });

  it('ends in llm_error with a safe message when the 500s outlast LLM_MAX_RETRIES', async () => {
    server.always({
      kind: 'json',
      status: 500,
      body: { error: { message: 'PROVIDER-INTERNAL-TEXT stack at db.query' } },
    });
    const context = contextOf([events.user('hi')]);
    const { outputs, error } = await settle(agent({ maxRetries: 2 }).step(context));
    expect(outputs).toEqual([]);
    expect(error).toBeInstanceOf(AgentTurnError);
    const turnError = error as AgentTurnError;
    expect(turnError.reason).toBe('llm_error');
    expect(turnError.safeMessage).toBe('the model server failed to answer (after 2 retries)');
    expect(turnError.safeMessage).not.toContain('PROVIDER');
    expect(server.requests).toHaveLength(3);
    expect(context.statuses).toHaveLength(2);
  });

  it('does not retry a request the server rejects (400)', async () => {
    server.reply({ kind: 'json', status: 400, body: { error: { message: 'bad' } } });
    const { error } = await settle(agent().step(contextOf([events.user('hi')])));
    expect(error).toMatchObject({
      reason: 'llm_error',
      safeMessage: 'the model server rejected the request',
    });
    expect(server.requests).toHaveLength(1);
  });

  it('retries a stream cut after some text: the retry starts the text afresh, and only its answer is the message', async () => {
    server.reply(
      {
        kind: 'stream',
        events: openAiStream({ text: ['The answer is'], finish: false }),
        cut: true,
      },
      { kind: 'stream', events: openAiStream({ text: ['The whole ', 'answer'] }) },
    );
    const context = contextOf([events.user('hi')]);
    const { outputs, error } = await settle(agent().step(context));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'delta', delta: 'The answer is' },
      { type: 'delta', delta: 'The whole ' },
      { type: 'delta', delta: 'answer' },
      { type: 'message', content: 'The whole answer' },
    ]);
    // The runtime restarts the step's text at the status (the next delta has offset 0).
    expect(context.statuses.map((s) => s.id)).toEqual([LLM_RETRY_STATUS]);
    expect(server.requests).toHaveLength(2);
  });

  it('never yields a stream cut after some text on every try as a final message', async () => {
    server.always({
      kind: 'stream',
      events: openAiStream({ text: ['The answer is'], finish: false }),
      cut: true,
    });
    const context = contextOf([events.user('hi')]);
    const { outputs, error } = await settle(agent({ maxRetries: 1 }).step(context));
    expect(outputs.filter((o) => o.type === 'message')).toEqual([]);
    expect(error).toMatchObject({
      reason: 'llm_error',
      safeMessage: "the model's answer was cut short (after 1 retry)",
    });
    expect(server.requests).toHaveLength(2);
    expect(context.statuses).toHaveLength(1);
  });

  it('treats a stream that ends without a finish reason as cut short', async () => {
    server.reply({ kind: 'stream', events: openAiStream({ text: ['half'], finish: false }) });
    const { outputs, error } = await settle(agent().step(contextOf([events.user('hi')])));
    expect(outputs.some((o) => o.type === 'message')).toBe(false);
    expect(error).toMatchObject({ reason: 'llm_error' });
  });

  it('retries a stream cut before any text (a tool call half sent), then answers', async () => {
    server.reply(
      {
        kind: 'stream',
        events: openAiStream({
          toolCalls: [{ id: 'call_1', name: 'current_time', argumentPieces: ['{"a'] }],
          finish: false,
        }),
        cut: true,
      },
      { kind: 'stream', events: openAiStream({ text: ['whole'] }) },
    );
    const context = askTime();
    const { outputs, error } = await settle(agent().step(context));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'delta', delta: 'whole' },
      { type: 'message', content: 'whole' },
    ]);
    expect(context.statuses.map((s) => s.id)).toEqual([LLM_RETRY_STATUS]);
  });

  it('gives up on a silent server after LLM_TIMEOUT_MS per try', async () => {
    server.always({ kind: 'stream', events: [], hang: true });
    const started = Date.now();
    const { error } = await settle(
      agent({ timeoutMs: 300, maxRetries: 1 }).step(contextOf([events.user('hi')])),
    );
    expect(error).toMatchObject({
      reason: 'llm_error',
      safeMessage: 'the model request timed out (after 1 retry)',
    });
    expect(server.requests).toHaveLength(2);
    expect(Date.now() - started).toBeGreaterThanOrEqual(600);
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it('closes the connection to the model server within 1 s of the abort', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({ text: ['thinking'], finish: false }),
      hang: true,
    });
    const controller = new AbortController();
    const context = contextOf([events.user('hi')], { signal: controller.signal });
    const iterator = agent().step(context)[Symbol.asyncIterator]();
    await iterator.next();
    const abortedAt = Date.now();
    controller.abort(new Error('stopped by the user'));
    const closedAt = await server.requests[0]!.closed;
    expect(closedAt - abortedAt).toBeLessThan(1000);
    await expect(iterator.next()).rejects.toThrow('stopped by the user');
    expect(context.statuses).toEqual([]);
  });

  it('closes the connection when the runtime stops reading the step', async () => {
    server.reply({
      kind: 'stream',
      events: openAiStream({ text: ['a'], finish: false }),
      hang: true,
    });
    const steps = agent().step(contextOf([events.user('hi')]));
    const iterator = steps[Symbol.asyncIterator]();
    await iterator.next();
    const stoppedAt = Date.now();
    await iterator.return?.(undefined);
    expect((await server.requests[0]!.closed) - stoppedAt).toBeLessThan(1000);
  });

  it('ends in llm_error when the model refuses', async () => {
    const refusal = openAiStream({ text: [] });
    refusal.splice(1, 0, {
      data: {
        id: 'x',
        object: 'chat.completion.chunk',
        created: 1,
        model: 'fake-model',
        choices: [
          { index: 0, delta: { refusal: 'I cannot help with that.' }, finish_reason: null },
        ],
      },
    });
    server.reply({ kind: 'stream', events: refusal });
    const { error } = await settle(agent().step(contextOf([events.user('hi')])));
    expect(error).toMatchObject({
      reason: 'llm_error',
      safeMessage: 'the model declined to answer',
    });
  });

  it('never lets the API key into what it yields or throws, even when the server echoes it', async () => {
    server.reply(
      {
        kind: 'stream',
        events: openAiStream({ text: ['fine'], usage: { prompt_tokens: 1, completion_tokens: 1 } }),
      },
      {
        kind: 'json',
        status: 401,
        body: { error: { message: `Incorrect API key provided: ${API_KEY}` } },
      },
      {
        kind: 'json',
        status: 500,
        body: { error: { message: `key ${API_KEY} exploded` } },
      },
    );
    const runs = [
      await settle(agent().step(contextOf([events.user('hi')]))),
      await settle(agent().step(contextOf([events.user('hi')]))),
      await settle(agent({ maxRetries: 0 }).step(contextOf([events.user('hi')]))),
    ];
    expect(runs[1]!.error).toMatchObject({
      safeMessage: 'the model server refused the credentials',
    });
    for (const run of runs) {
      const seen =
        JSON.stringify(run.outputs) + inspect(run.error, { depth: 20 }) + String(run.error);
      expect(seen).not.toContain(API_KEY);
    }
  });
});

describe(`${LlmAgent.name} on an Anthropic Messages server`, () => {
  const anthropic = () => agent({ provider: 'anthropic', baseUrl: server.url });

  it('titles with one request, not streamed and capped (the SDK refuses one with the family default)', async () => {
    server.reply({
      kind: 'json',
      status: 200,
      body: {
        id: 'msg_01',
        type: 'message',
        role: 'assistant',
        model: 'claude-sonnet-4-5',
        content: [{ type: 'text', text: 'Lisbon in May' }],
        stop_reason: 'end_turn',
        stop_sequence: null,
        usage: { input_tokens: 50, output_tokens: 4 },
      },
    });
    const result = await anthropic().title(
      contextOf([events.user('I want to visit Lisbon in May'), events.agent('Go!')]),
    );
    expect(result.title).toBe('Lisbon in May');
    const body = server.requests[0]!.body;
    expect(body['stream']).toBeFalsy();
    expect(body['max_tokens']).toBe(64);
  });

  it('streams text, assembles tool_use input from its JSON pieces and reports usage', async () => {
    server.reply({
      kind: 'stream',
      events: anthropicStream({
        text: ['Checking', ' the clock.'],
        toolUses: [
          { id: 'toolu_01', name: 'current_time', argumentPieces: ['{"zone"', ': "UTC"}'] },
        ],
        usage: { input_tokens: 300, output_tokens: 40 },
      }),
    });
    const context = contextOf([events.user('time?')], {
      tools: [CURRENT_TIME_TOOL],
      instructions: 'You are a clock.',
    });
    const { outputs, error } = await settle(anthropic().step(context));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'delta', delta: 'Checking' },
      { type: 'delta', delta: ' the clock.' },
      { type: 'usage', prompt_tokens: 300, completion_tokens: 40, cost_usd: 0.001 },
      {
        type: 'tool_call',
        tool: 'current_time',
        arguments: { zone: 'UTC' },
        tool_call_id: 'toolu_01',
      },
    ]);
    const request = server.requests[0]!;
    expect(request.path).toBe('/v1/messages');
    expect(request.headers['x-api-key']).toBe(API_KEY);
    expect(request.body).toMatchObject({
      model: 'fake-model',
      stream: true,
      system: 'You are a clock.',
      messages: [{ role: 'user', content: [{ type: 'text', text: 'time?' }] }],
    });
  });

  it('reads no key or token of its own from the environment', async () => {
    vi.stubEnv('ANTHROPIC_API_KEY', 'sk-ant-from-the-environment');
    vi.stubEnv('ANTHROPIC_AUTH_TOKEN', 'token-from-the-environment');
    server.reply({ kind: 'stream', events: anthropicStream({ text: ['ok'] }) });
    const llm = agent({ provider: 'anthropic', baseUrl: server.url, apiKey: undefined });
    await settle(llm.step(contextOf([events.user('hi')])));
    const { headers } = server.requests[0]!;
    expect(JSON.stringify(headers)).not.toContain('from-the-environment');
    expect(headers.authorization).toBeUndefined();
    expect(headers['x-api-key']).toBeUndefined();
  });

  it('answers with a message after a tool result, sent back as a tool_result block', async () => {
    server.reply({ kind: 'stream', events: anthropicStream({ text: ['Noon.'] }) });
    const history = [
      events.user('time?'),
      events.toolCall('current_time', {}, 'toolu_01'),
      events.toolResult('current_time', '12:00', 'toolu_01'),
    ];
    const { outputs } = await settle(
      anthropic().step(contextOf(history, { tools: [CURRENT_TIME_TOOL] })),
    );
    expect(outputs.at(-1)).toEqual({ type: 'message', content: 'Noon.' });
    const messages = server.requests[0]!.body['messages'] as { role: string; content: unknown[] }[];
    expect(messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
    expect(messages[1]!.content).toEqual([
      expect.objectContaining({
        type: 'tool_use',
        id: 'toolu_01',
        name: 'current_time',
        input: {},
      }),
    ]);
    expect(messages[2]!.content).toEqual([
      expect.objectContaining({ type: 'tool_result', tool_use_id: 'toolu_01', content: '12:00' }),
    ]);
  });

  it('sends Anthropic a history it accepts: the text written before the calls, each step its own turn, each result with its own call, no blank text', async () => {
    server.reply({ kind: 'stream', events: anthropicStream({ text: ['Done.'] }) });
    const question = events.user('   '); // only an attachment, whose URL is never passed on
    const step = (id: string, result: string, text: string) => {
      const call = {
        ...events.toolCall('current_time', {}, id),
        message: text,
        cause: question.id,
      };
      return [call, { ...events.toolResult('current_time', result, id), cause: call.id }];
    };
    const history = [
      question,
      // A provider that counts ids afresh each response gives both steps' calls `call_0`.
      ...step('call_0', 'MIDNIGHT', 'Let me look.'),
      ...step('call_0', '', 'Once more.'),
    ];
    await settle(anthropic().step(contextOf(history, { tools: [CURRENT_TIME_TOOL] })));
    const messages = server.requests[0]!.body['messages'] as {
      role: string;
      content: Record<string, unknown>[];
    }[];
    expect(messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user', 'assistant', 'user']);
    expect(messages[0]!.content).toEqual([{ type: 'text', text: EMPTY_USER_MESSAGE }]);
    expect(messages[1]!.content.map((b) => b['text'] ?? b['id'])).toEqual([
      'Let me look.',
      'call_0',
    ]);
    expect(messages[2]!.content).toEqual([
      expect.objectContaining({ tool_use_id: 'call_0', content: 'MIDNIGHT' }),
    ]);
    const secondId = `call_cs${history[3]!.id}`;
    expect(messages[3]!.content.map((b) => b['text'] ?? b['id'])).toEqual(['Once more.', secondId]);
    expect(messages[4]!.content).toEqual([
      expect.objectContaining({ tool_use_id: secondId, content: EMPTY_RESULT }),
    ]);
  });

  it('retries an overloaded error (529) and a stream that stops before message_stop', async () => {
    server.reply(
      {
        kind: 'json',
        status: 529,
        body: { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } },
      },
      { kind: 'stream', events: anthropicStream({ text: [], finish: false }) },
      { kind: 'stream', events: anthropicStream({ text: ['ok'] }) },
    );
    const context = contextOf([events.user('hi')]);
    const { outputs, error } = await settle(anthropic().step(context));
    expect(error).toBeUndefined();
    expect(outputs.at(-1)).toEqual({ type: 'message', content: 'ok' });
    expect(context.statuses).toHaveLength(2);
  });

  it('does not complete a message whose stream stops before message_stop', async () => {
    server.always({
      kind: 'stream',
      events: anthropicStream({ text: ['partial'], finish: false }),
    });
    const { outputs, error } = await settle(anthropic().step(contextOf([events.user('hi')])));
    // Each try streams its part, then is cut: never a message.
    expect(outputs.length).toBeGreaterThan(0);
    expect(outputs.every((o) => o.type === 'delta' && o.delta === 'partial')).toBe(true);
    expect(error).toMatchObject({ reason: 'llm_error' });
  });
});

describe('LlmAgent.title', () => {
  it('asks the model once, without streaming, and returns the title with its usage', async () => {
    server.reply({
      kind: 'json',
      status: 200,
      body: openAiCompletion('"Planning a trip to Lisbon."', {
        prompt_tokens: 100,
        completion_tokens: 6,
      }),
    });
    const context = contextOf([
      events.user('I want to visit Lisbon in May, what should I see?'),
      events.agent('Belém, Alfama and the LX Factory.'),
    ]);
    const result = await agent().title(context);
    expect(result).toEqual({
      title: 'Planning a trip to Lisbon',
      usage: { prompt_tokens: 100, completion_tokens: 6, cost_usd: 0.00026 },
    });
    const body = server.requests[0]!.body;
    expect(body['stream']).toBeFalsy();
    expect(JSON.stringify(body['messages'])).toContain('visit Lisbon');
    // No length cap: OpenAI's reasoning models answer 400 to `max_tokens`, and spend a
    // small `max_completion_tokens` on reasoning, leaving no title.
    expect(body).not.toHaveProperty('max_tokens');
    expect(body).not.toHaveProperty('max_completion_tokens');
  });

  it('throws when the model fails, so that the fallback title applies', async () => {
    server.always({ kind: 'json', status: 500, body: { error: { message: `boom ${API_KEY}` } } });
    const error = await agent()
      .title(contextOf([events.user('hello there'), events.agent('hi')]))
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Error);
    expect(inspect(error, { depth: 20 })).not.toContain(API_KEY);
  });

  it('cleans what the model answers into one short line', () => {
    expect(cleanTitle('Title: "Trip to Lisbon".\nMore text')).toBe('Trip to Lisbon');
    expect(cleanTitle('  **Budget   review**  ')).toBe('Budget review');
    expect(cleanTitle('word '.repeat(40)).length).toBeLessThanOrEqual(80);
  });
});
