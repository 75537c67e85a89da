import { inspect } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentTurnError } from '@cs/core';
import type { StoredEvent } from '@cs/protocol';
import {
  CURRENT_TIME_TOOL,
  contextOf,
  events,
  resetEventIds,
  settle,
} from '../../../../test/fakes/agent-context.js';
import { FakeRemoteAgent, pause } from '../../../../test/fakes/fake-remote-agent.js';
import { HTTP_AGENT_MAX_BYTES, HttpAgent } from './http.agent.js';

const SECRET = 'the-hmac-secret-of-this-test';
let remote: FakeRemoteAgent;

beforeEach(async () => {
  resetEventIds();
  remote = await FakeRemoteAgent.start(SECRET, (_request, answer) => {
    answer.lines({ type: 'message', content: 'default' });
  });
});

afterEach(async () => {
  await remote.close();
});

function httpAgent(overrides: { secret?: string; timeoutMs?: number; url?: string } = {}) {
  return new HttpAgent({
    url: overrides.url ?? remote.url,
    secret: overrides.secret ?? SECRET,
    timeoutMs: overrides.timeoutMs ?? 5000,
    agentConfig: { persona: 'pirate' },
  });
}

function conversation(count: number): StoredEvent[] {
  const history: StoredEvent[] = [];
  for (let i = 0; i < count - 1; i += 1)
    history.push(i % 2 ? events.agent(`a${i}`) : events.user(`u${i}`));
  history.push(events.user('the trigger'));
  return history;
}

describe(HttpAgent.name, () => {
  it('posts a signed request the remote agent verifies, with the last 100 events and the tools', async () => {
    remote.answerWith((_request, answer) => {
      answer.lines({ type: 'delta', delta: 'Hi ' }, { type: 'delta', delta: 'there' });
      answer.lines({ type: 'message', content: 'Hi there' });
    });
    const history = conversation(150);
    const context = contextOf(history, {
      tools: [CURRENT_TIME_TOOL],
      instructions: 'Be nice.',
      state: { 'user:lang': 'fr' },
      conversation_id: 'conv-http-1',
    });
    const { outputs, error } = await settle(httpAgent().step(context));
    expect(error).toBeUndefined();
    expect(outputs).toEqual([
      { type: 'delta', delta: 'Hi ' },
      { type: 'delta', delta: 'there' },
      { type: 'message', content: 'Hi there' },
    ]);

    const request = remote.requests[0]!;
    expect(request.verified).toBe(true);
    expect(request.headers['content-type']).toBe('application/json');
    expect(request.headers['idempotency-key']).toBe('conv-http-1:149');
    expect(request.headers['x-cs-signature']).toMatch(/^sha256=[0-9a-f]{64}$/);
    expect(Math.abs(Number(request.headers['x-cs-timestamp']) - Date.now() / 1000)).toBeLessThan(5);
    const body = request.body;
    expect(Object.keys(body).sort()).toEqual(
      [
        'agent_config',
        'conversation_id',
        'events',
        'instructions',
        'state',
        'tenant_id',
        'tools',
        'trigger',
        'user_id',
      ].sort(),
    );
    expect(body).toMatchObject({
      conversation_id: 'conv-http-1',
      tenant_id: 'tenant-test',
      user_id: 'user-test',
      instructions: 'Be nice.',
      state: { 'user:lang': 'fr' },
      tools: [CURRENT_TIME_TOOL],
      trigger: history.at(-1),
      agent_config: { persona: 'pirate' },
    });
    const sent = body['events'] as StoredEvent[];
    expect(sent).toHaveLength(100);
    expect(sent[0]!.id).toBe(50);
    expect(sent.at(-1)).toEqual(history.at(-1));
  });

  it('sends the same idempotency-key when the step is repeated from the same history', async () => {
    const history = conversation(3);
    await settle(httpAgent().step(contextOf(history, { conversation_id: 'c9' })));
    await settle(httpAgent().step(contextOf(history, { conversation_id: 'c9' })));
    expect(remote.requests.map((r) => r.headers['idempotency-key'])).toEqual(['c9:2', 'c9:2']);
    expect(remote.requests[0]!.headers['x-cs-signature']).toBeDefined();
  });

  it('keeps the idempotency-key of a step repeated after a failover, whose new holder stored state changes since', async () => {
    const user = events.user('the trigger');
    const before = [user, events.stateChanged('running')];
    const call = events.toolCall('current_time', {}, 'call_1');
    const result = events.toolResult('current_time', 'noon', 'call_1');
    // The holder that died, in step 2; the new holder stored loading, awaiting_user_input, running.
    const died = [...before, call, result];
    const resumed = [
      ...died,
      events.stateChanged('loading'),
      events.stateChanged('awaiting_user_input'),
      events.stateChanged('running'),
    ];
    await settle(httpAgent().step(contextOf(died, { conversation_id: 'c7' })));
    await settle(httpAgent().step(contextOf(resumed, { conversation_id: 'c7' })));
    expect(remote.requests.map((r) => r.headers['idempotency-key'])).toEqual([
      `c7:${result.id}`,
      `c7:${result.id}`,
    ]);
    // A step whose history ends with its trigger and state changes is keyed by the trigger.
    await settle(
      httpAgent().step(
        contextOf([user, events.stateChanged('running')], { conversation_id: 'c7' }),
      ),
    );
    expect(remote.requests[2]!.headers['idempotency-key']).toBe(`c7:${user.id}`);
  });

  it('yields each output as its line arrives, also a line split across chunks', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    remote.answerWith(async (_request, answer) => {
      answer.lines({ type: 'delta', delta: 'early' });
      answer.raw('{"type":"delta",');
      await pause(30);
      answer.raw('"delta":"split"}\n');
      await gate;
      answer.lines({ type: 'message', content: 'earlysplit' });
    });
    const steps = httpAgent().step(contextOf(conversation(1)));
    const iterator = steps[Symbol.asyncIterator]();
    expect((await iterator.next()).value).toEqual({ type: 'delta', delta: 'early' });
    expect((await iterator.next()).value).toEqual({ type: 'delta', delta: 'split' });
    release();
    expect((await iterator.next()).value).toEqual({ type: 'message', content: 'earlysplit' });
    expect((await iterator.next()).done).toBe(true);
  });

  it('ends in agent_http_error when the remote agent refuses a wrong secret (401)', async () => {
    const { outputs, error } = await settle(
      httpAgent({ secret: 'not-the-secret-at-all' }).step(contextOf(conversation(1))),
    );
    expect(remote.requests[0]!.verified).toBe(false);
    expect(outputs).toEqual([]);
    expect(error).toBeInstanceOf(AgentTurnError);
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: 'the remote agent answered with status 401',
    });
    expect(inspect(error, { depth: 20 })).not.toContain('not-the-secret-at-all');
  });

  it('ends in agent_http_error on a 2xx answer that is not NDJSON (a proxy page, a wrong URL), storing none of its lines', async () => {
    remote.answerWith((_request, answer) => {
      answer.res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      answer.res.end('<html>\n<body>Welcome to nginx!</body>\n</html>\n');
    });
    const { outputs, error } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(outputs).toEqual([]);
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: 'the remote agent answered text/html, not application/x-ndjson',
    });
  });

  it('turns malformed lines into error observations and goes on', async () => {
    remote.answerWith((_request, answer) => {
      answer.raw('this is not json\n');
      answer.lines({ type: 'delta' }, { type: 'telepathy', content: 'x' });
      answer.raw('\n');
      answer.lines({ type: 'message', content: 'still here' });
    });
    const { outputs, error } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(error).toBeUndefined();
    expect(outputs).toHaveLength(4);
    for (const output of outputs.slice(0, 3)) {
      expect(output).toMatchObject({ type: 'event', body: { observation: 'error', extras: {} } });
    }
    expect(outputs[0]).toMatchObject({
      body: { content: "line 1 of the remote agent's answer is not JSON" },
    });
    expect((outputs[1] as { body: { content: string } }).body.content).toMatch(
      /^line 2 of the remote agent's answer is not an agent output/,
    );
    expect(outputs[3]).toEqual({ type: 'message', content: 'still here' });
  });

  it('turns a line nested too deep or holding text that cannot be stored into an error observation, and goes on', async () => {
    remote.answerWith((_request, answer) => {
      answer.raw(`{"type":"state","delta":{"a":${'['.repeat(100_000)}${']'.repeat(100_000)}}}\n`);
      answer.lines({ type: 'message', content: 'nul \u0000 here' });
      answer.lines({ type: 'message', content: 'still here' });
    });
    const { outputs, error } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(error).toBeUndefined();
    expect(outputs.map((output) => (output.type === 'event' ? output.body : output))).toEqual([
      expect.objectContaining({
        content: expect.stringMatching(/^line 1 .*nested more than 32 deep/),
      }),
      expect.objectContaining({ content: expect.stringMatching(/^line 2 .*cannot be stored/) }),
      { type: 'message', content: 'still here' },
    ]);
  });

  it('accepts a last line without a newline', async () => {
    remote.answerWith((_request, answer) =>
      answer.raw('{"type":"message","content":"no newline"}'),
    );
    const { outputs } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(outputs).toEqual([{ type: 'message', content: 'no newline' }]);
  });

  it('ends in agent_http_error past 10 MiB', async () => {
    const line = `${JSON.stringify({ type: 'delta', delta: 'x'.repeat(64 * 1024) })}\n`;
    remote.answerWith(async (_request, answer) => {
      for (
        let sent = 0;
        sent <= HTTP_AGENT_MAX_BYTES + line.length && !answer.closed;
        sent += line.length
      ) {
        answer.raw(line);
        if (sent % (1024 * 1024) < line.length) await pause(1);
      }
      return 'hang';
    });
    const { outputs, error } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: `the remote agent's answer exceeds ${HTTP_AGENT_MAX_BYTES} bytes`,
    });
    const text = outputs.map((o) => (o.type === 'delta' ? o.delta : '')).join('');
    expect(text.length).toBeLessThanOrEqual(HTTP_AGENT_MAX_BYTES);
    expect(text.length).toBeGreaterThan(HTTP_AGENT_MAX_BYTES - 2 * line.length);
  });

  it('ends in agent_http_error after AGENT_HTTP_TIMEOUT_MS of silence mid-answer', async () => {
    remote.answerWith((_request, answer) => {
      answer.lines({ type: 'delta', delta: 'then nothing' });
      return 'hang';
    });
    const started = Date.now();
    const { outputs, error } = await settle(
      httpAgent({ timeoutMs: 300 }).step(contextOf(conversation(1))),
    );
    expect(outputs).toEqual([{ type: 'delta', delta: 'then nothing' }]);
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: 'the remote agent was silent for longer than 300 ms',
    });
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(Date.now() - started).toBeLessThan(3000);
    expect(await remote.requests[0]!.closed).toBeGreaterThan(0);
  });

  it('ends in agent_http_error when the headers never come', async () => {
    remote.answerWith(() => 'hang');
    const { error } = await settle(httpAgent({ timeoutMs: 200 }).step(contextOf(conversation(1))));
    expect(error).toMatchObject({ reason: 'agent_http_error' });
  });

  it('does not count a slow reader as silence of the remote agent', async () => {
    remote.answerWith((_request, answer) => {
      answer.lines({ type: 'delta', delta: 'a' }, { type: 'message', content: 'a' });
    });
    const outputs: unknown[] = [];
    for await (const output of httpAgent({ timeoutMs: 100 }).step(contextOf(conversation(1)))) {
      outputs.push(output);
      await pause(250);
    }
    expect(outputs).toHaveLength(2);
  });

  it('ends in agent_http_error when the answer is cut short', async () => {
    remote.answerWith(async (_request, answer) => {
      answer.lines({ type: 'delta', delta: 'half' });
      await pause(20);
      answer.res.socket?.destroy();
      return 'hang';
    });
    const { outputs, error } = await settle(httpAgent().step(contextOf(conversation(1))));
    expect(outputs).toEqual([{ type: 'delta', delta: 'half' }]);
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: "the remote agent's answer was cut short",
    });
  });

  it('ends in agent_http_error when the remote agent cannot be reached', async () => {
    const url = remote.url;
    await remote.close();
    const { error } = await settle(httpAgent({ url }).step(contextOf(conversation(1))));
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: 'the remote agent cannot be reached',
    });
    remote = await FakeRemoteAgent.start(SECRET, () => undefined);
  });

  it('closes the connection within 1 s of the abort', async () => {
    remote.answerWith((_request, answer) => {
      answer.lines({ type: 'delta', delta: 'working' });
      return 'hang';
    });
    const controller = new AbortController();
    const steps = httpAgent().step(contextOf(conversation(1), { signal: controller.signal }));
    const iterator = steps[Symbol.asyncIterator]();
    await iterator.next();
    const abortedAt = Date.now();
    controller.abort(new Error('stopped'));
    await expect(iterator.next()).rejects.toThrow('stopped');
    expect((await remote.requests[0]!.closed) - abortedAt).toBeLessThan(1000);
  });
});
