import { describe, expect, it } from 'vitest';
import type { AgentOutput, StoredEvent } from '@cs/protocol';
import type { Agent, AgentContext } from '../agent.js';
import { DeltaStream } from './delta-stream.js';
import { MAX_AGENT_MESSAGE_CHARS } from '@cs/protocol';
import { InvalidAgentOutputError, MAX_OUTPUTS_PER_STEP, runStep } from './step-runner.js';

const trigger = {
  id: 0,
  source: 'user',
  action: 'message',
  args: { content: 'hi' },
  message: 'hi',
  timestamp: '2026-01-01T00:00:00.000Z',
} as unknown as StoredEvent;

function context(signal = new AbortController().signal): AgentContext {
  return {
    conversation_id: 'c',
    tenant_id: 't',
    user_id: 'u',
    trigger,
    state: {},
    instructions: null,
    tools: [],
    signal,
    history: {
      last_event_id: 0,
      recent: () => Promise.resolve([trigger]),
      async *range() {
        yield trigger;
      },
    },
    step: 1,
  };
}

/** An agent yielding `outputs`, that says whether its iterator was closed. */
function agentOf(outputs: () => Iterable<unknown>): Agent & { closed: boolean } {
  const agent = {
    closed: false,
    async *step(): AsyncIterable<AgentOutput> {
      try {
        for (const output of outputs()) {
          await Promise.resolve();
          yield output as AgentOutput;
        }
      } finally {
        agent.closed = true;
      }
    },
  };
  return agent;
}

describe('runStep', () => {
  it('streams the deltas and takes the message as the step text', async () => {
    const published: string[] = [];
    const stream = new DeltaStream(0, (delta) => published.push(delta.delta));
    const agent = agentOf(() => [
      { type: 'delta', delta: 'Hel' },
      { type: 'delta', delta: 'lo' },
      { type: 'message', content: 'Hello' },
    ]);
    const result = await runStep(agent, context(), stream);
    expect(result).toMatchObject({ end: 'done', answered: true, text: 'Hello' });
    expect(published.join('')).toBe('Hello');
  });

  it('keeps the streamed text as the step text when the final message is empty', async () => {
    const stream = new DeltaStream(0, () => undefined);
    const agent = agentOf(() => [
      { type: 'delta', delta: 'Hel' },
      { type: 'delta', delta: 'lo' },
      { type: 'message', content: '' },
    ]);
    const result = await runStep(agent, context(), stream);
    expect(result).toMatchObject({ end: 'done', answered: true, text: 'Hello' });
  });

  it('fails a step that streams more than MAX_AGENT_MESSAGE_CHARS, keeps what fits and closes the agent', async () => {
    const piece = 'x'.repeat(100_000);
    const agent = agentOf(function* () {
      for (;;) yield { type: 'delta', delta: piece };
    });
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result.end).toBe('failed');
    expect(result.error).toBeInstanceOf(InvalidAgentOutputError);
    expect(result.text).toHaveLength(MAX_AGENT_MESSAGE_CHARS);
    await new Promise((resolve) => setImmediate(resolve));
    expect(agent.closed).toBe(true);
  });

  it('takes a long answer streamed in more deltas than MAX_OUTPUTS_PER_STEP (a token each)', async () => {
    const deltas = MAX_OUTPUTS_PER_STEP * 2;
    const agent = agentOf(function* () {
      for (let i = 0; i < deltas; i += 1) yield { type: 'delta', delta: 'tok ' };
      yield { type: 'usage', prompt_tokens: 1, completion_tokens: deltas };
    });
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result.end).toBe('done');
    expect(result.text).toHaveLength(deltas * 4);
  });

  it('cuts off a step of endless outputs that add no text, empty deltas included', async () => {
    for (const output of [
      { type: 'delta', delta: '' },
      { type: 'state', delta: { n: 1 } },
    ]) {
      const agent = agentOf(function* () {
        for (;;) yield output;
      });
      const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
      expect(result.end).toBe('failed');
      expect(String(result.error)).toMatch(/more than 10000 outputs/);
    }
  });

  it('fails a step whose tool calls share an id', async () => {
    const call = { type: 'tool_call', tool: 'current_time', arguments: {}, tool_call_id: 'dup' };
    const result = await runStep(
      agentOf(() => [call, call]),
      context(),
      new DeltaStream(0, () => undefined),
    );
    expect(result.end).toBe('failed');
    expect(String(result.error)).toMatch(/tool_call_id dup is used twice/);
  });

  it('fails a step that streams or answers again after its message: that text would never be stored', async () => {
    for (const after of [
      { type: 'delta', delta: ' more' },
      { type: 'message', content: 'a second answer' },
    ]) {
      const agent = agentOf(() => [{ type: 'message', content: 'the answer' }, after]);
      const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
      expect(result.end).toBe('failed');
      expect(String(result.error)).toMatch(new RegExp(`a ${after.type} after the step's message`));
    }
    const agent = agentOf(() => [
      { type: 'message', content: 'the answer' },
      { type: 'usage', prompt_tokens: 1, completion_tokens: 2 },
      { type: 'finish' },
    ]);
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result).toMatchObject({ end: 'done', text: 'the answer', finished: {} });
  });

  it('fails a step whose message is longer than MAX_AGENT_MESSAGE_CHARS', async () => {
    const agent = agentOf(() => [
      { type: 'message', content: 'y'.repeat(MAX_AGENT_MESSAGE_CHARS + 1) },
    ]);
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result.end).toBe('failed');
    expect(result.text).toHaveLength(MAX_AGENT_MESSAGE_CHARS);
  });

  it('keeps whole characters when the cut falls inside an emoji (a lone surrogate cannot be stored)', async () => {
    const agent = agentOf(() => [
      { type: 'message', content: `${'y'.repeat(MAX_AGENT_MESSAGE_CHARS - 1)}😀 and more` },
    ]);
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result.end).toBe('failed');
    expect(result.text).toBe('y'.repeat(MAX_AGENT_MESSAGE_CHARS - 1));
  });

  it('closes the agent whose output is refused, so that it stops its work', async () => {
    const agent = agentOf(() => [
      { type: 'delta', delta: 'a' },
      { type: 'nonsense' },
      { type: 'delta', delta: 'b' },
    ]);
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result.end).toBe('failed');
    expect(result.error).toBeInstanceOf(InvalidAgentOutputError);
    await new Promise((resolve) => setImmediate(resolve));
    expect(agent.closed).toBe(true);
  });

  it('fails a step that ends with a message or finish and with tool calls, in either order', async () => {
    const call = { type: 'tool_call', tool: 'current_time', arguments: {} };
    for (const outputs of [
      [{ type: 'message', content: 'done' }, call],
      [call, { type: 'message', content: 'done' }],
      [call, { type: 'finish' }],
      [{ type: 'finish' }, call],
    ]) {
      const result = await runStep(
        agentOf(() => outputs),
        context(),
        new DeltaStream(0, () => undefined),
      );
      expect(result.end).toBe('failed');
      expect(String(result.error)).toMatch(/not both/);
    }
    // A message with finish is one end.
    const finished = await runStep(
      agentOf(() => [{ type: 'message', content: 'done' }, { type: 'finish' }]),
      context(),
      new DeltaStream(0, () => undefined),
    );
    expect(finished).toMatchObject({ end: 'done', answered: true, finished: {} });
  });

  it('applies state changes in the order yielded, events with theirs included', async () => {
    const note = (state_delta: Record<string, unknown>) => ({
      type: 'event',
      body: { observation: 'note', content: '', extras: {}, message: '' },
      state_delta,
    });
    const result = await runStep(
      agentOf(() => [
        { type: 'state', delta: { a: 1 } },
        note({ a: 2, b: 1 }),
        { type: 'state', delta: { b: 2 } },
      ]),
      context(),
      new DeltaStream(0, () => undefined),
    );
    // Stored in order: the step's own change first, then the event's, its later change with it.
    expect(result.stateDelta).toEqual({ a: 1 });
    expect(result.events.map((e) => e.stateDelta)).toEqual([{ a: 2, b: 2 }]);
  });

  it('does not call return() on an agent whose iterator threw', async () => {
    let returned = 0;
    const iterator: AsyncIterator<AgentOutput> = {
      next: () => Promise.reject(new Error('the agent broke')),
      return: () => {
        returned += 1;
        return Promise.resolve({ done: true, value: undefined });
      },
    };
    const agent: Agent = { step: () => ({ [Symbol.asyncIterator]: () => iterator }) };
    const result = await runStep(agent, context(), new DeltaStream(0, () => undefined));
    expect(result).toMatchObject({ end: 'failed' });
    expect(returned).toBe(0);
  });
});
