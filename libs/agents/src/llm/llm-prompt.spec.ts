import { beforeEach, describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import {
  CURRENT_TIME_TOOL,
  contextOf,
  events,
  resetEventIds,
} from '../../../../test/fakes/agent-context.js';
import { PromptTooLargeError, buildLlmPrompt, leftOutNote } from './llm-prompt.js';
import type { PromptMessage } from './model-client.js';
import { MESSAGE_OVERHEAD_TOKENS, tokenCounter } from './token-counter.js';

beforeEach(() => resetEventIds());

const { count: countTextTokens, truncate: truncateToTokens } = await tokenCounter();

/** Counts a built prompt again, independently of the builder's own bookkeeping. */
function recount(system: string | undefined, messages: PromptMessage[], tools = 0): number {
  let total = system ? countTextTokens(system) + MESSAGE_OVERHEAD_TOKENS : 0;
  total += tools;
  for (const message of messages) {
    total += MESSAGE_OVERHEAD_TOKENS;
    if (message.role === 'tool_calls') total += countTextTokens(JSON.stringify(message.calls));
    else total += countTextTokens(message.content);
  }
  return total;
}

function longConversation(turns: number): StoredEvent[] {
  const history: StoredEvent[] = [events.user('FIRST: plan the migration of our billing system')];
  for (let i = 1; i <= turns; i += 1) {
    history.push(events.agent(`answer ${i}: ${'details of the plan '.repeat(8)}`));
    history.push(events.stateChanged('awaiting_user_input'));
    history.push(events.user(`question ${i}: ${'and what about the next part '.repeat(6)}`));
  }
  return history;
}

describe('buildLlmPrompt', () => {
  it('sends a short conversation whole, without a note', async () => {
    const history = [events.user('hello'), events.agent('hi!'), events.user('how are you?')];
    const prompt = await buildLlmPrompt(contextOf(history, { instructions: 'Be kind.' }), [], 1000);
    expect(prompt.system).toBe('Be kind.');
    expect(prompt.messages).toEqual([
      { role: 'user', content: 'hello' },
      { role: 'assistant', content: 'hi!' },
      { role: 'user', content: 'how are you?' },
    ]);
    expect(prompt.leftOut).toBe(0);
    expect(prompt.tokens).toBe(recount('Be kind.', prompt.messages));
  });

  it('keeps a long conversation under the budget: instructions, first message, a note, the latest events', async () => {
    const history = longConversation(2000); // 6001 events
    const context = contextOf(history, { instructions: 'You are a planner.' });
    const max = 3000;
    const prompt = await buildLlmPrompt(context, [CURRENT_TIME_TOOL], max);

    const toolTokens = countTextTokens(JSON.stringify([CURRENT_TIME_TOOL]));
    expect(recount(prompt.system, prompt.messages, toolTokens)).toBeLessThanOrEqual(max);
    expect(prompt.tokens).toBeLessThanOrEqual(max);
    expect(prompt.tokens).toBeGreaterThan(max * 0.8);

    expect(prompt.messages[0]).toEqual({
      role: 'user',
      content: 'FIRST: plan the migration of our billing system',
    });
    expect(prompt.messages[1]).toEqual({ role: 'user', content: leftOutNote(prompt.leftOut) });
    expect(prompt.messages.at(-1)).toEqual({ role: 'user', content: history.at(-1)!.message });

    // What was left out is exactly what lies between the first message and the window.
    const oldestShown = (prompt.messages[2] as { content: string }).content;
    const oldestEvent = history.find((e) => e.message === oldestShown)!;
    const between = history.filter((e) => e.id > 0 && e.id < oldestEvent.id);
    expect(prompt.leftOut).toBe(between.length);
    expect(prompt.leftOut).toBeGreaterThan(5000);

    // A long conversation is never read whole.
    expect(context.history.read).toBeLessThan(600);
  });

  it('leaves out a tool result whose call fell out of the window, and a call without its result', async () => {
    const history = [
      events.user('first'),
      // A call is never cut: this one does not fit, so the window ends after it.
      events.toolCall('files__write', { text: 'alpha beta gamma delta '.repeat(200) }, 'call_old'),
      events.toolResult('files__write', 'written', 'call_old'),
      events.user('again'),
      events.toolCall('current_time', {}, 'call_lost'),
      events.user('and now?'),
    ];
    const prompt = await buildLlmPrompt(contextOf(history), [], 400);
    expect(prompt.messages).toEqual([
      { role: 'user', content: 'first' },
      { role: 'user', content: leftOutNote(1) },
      { role: 'user', content: 'again' },
      { role: 'user', content: 'and now?' },
    ]);
    expect(prompt.leftOut).toBe(1);
  });

  it('places each tool result right after its call, even when a message was stored between them', async () => {
    const history = [
      events.user('time?'),
      events.toolCall('current_time', {}, 'call_1'),
      events.toolCall('set_state', { key: 'k', value: 1 }, 'call_2'),
      events.user('never mind'),
      events.toolResult('current_time', 'rejected by the user', 'call_1', true),
      events.toolResult('set_state', 'rejected by the user', 'call_2', true),
    ];
    const prompt = await buildLlmPrompt(contextOf(history), [], 5000);
    expect(prompt.messages).toEqual([
      { role: 'user', content: 'time?' },
      {
        role: 'tool_calls',
        calls: [
          {
            id: 'call_1',
            tool: 'current_time',
            input: {},
            result: 'rejected by the user',
            isError: true,
          },
          {
            id: 'call_2',
            tool: 'set_state',
            input: { key: 'k', value: 1 },
            result: 'rejected by the user',
            isError: true,
          },
        ],
      },
      { role: 'user', content: 'never mind' },
    ]);
  });

  it('places an answer stored after a message queued behind its turn before that message, so that the prompt ends with the trigger', async () => {
    const first = events.user('first question');
    const second = events.user('second question'); // enqueued while the first was answered
    const third = events.user('third question');
    const history = [
      first,
      second,
      third,
      { ...events.agent('first answer'), cause: first.id },
      { ...events.agent('second answer'), cause: second.id },
    ];
    const prompt = await buildLlmPrompt(contextOf(history), [], 5000);
    expect(prompt.messages).toEqual([
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: 'first answer' },
      { role: 'user', content: 'second question' },
      { role: 'assistant', content: 'second answer' },
      { role: 'user', content: 'third question' },
    ]);
  });

  it('keeps an interrupted turn (its tool calls, then its partial text) before the message that interrupted it', async () => {
    const question = events.user('what time is it?');
    const call = { ...events.toolCall('current_time', {}, 'call_1'), cause: question.id };
    const result = {
      ...events.toolResult('current_time', '2026-01-01T00:00:00Z', 'call_1'),
      cause: call.id,
    };
    const interruption = events.user('never mind, tell me a joke');
    const partial = {
      ...events.agent('It is midnight, and'),
      args: { content: 'It is midnight, and', interrupted: true },
      cause: question.id,
    };
    const prompt = await buildLlmPrompt(
      contextOf([question, call, result, interruption, partial]),
      [],
      5000,
    );
    expect(prompt.messages).toEqual([
      { role: 'user', content: 'what time is it?' },
      {
        role: 'tool_calls',
        calls: [
          {
            id: 'call_1',
            tool: 'current_time',
            input: {},
            result: '2026-01-01T00:00:00Z',
            isError: false,
          },
        ],
      },
      { role: 'assistant', content: 'It is midnight, and' },
      { role: 'user', content: 'never mind, tell me a joke' },
    ]);
  });

  it("sends each step's calls as one message with the text written before them, once, and leaves out a blank answer", async () => {
    const question = events.user('compare a and b');
    const call = (callId: string, path: string, text: string) => ({
      ...events.toolCall('files__read', { path }, callId),
      message: text,
      cause: question.id,
    });
    const result = (of: StoredEvent, content: string) => ({
      ...events.toolResult('files__read', content, `call_${content.toLowerCase()}`),
      cause: of.id,
    });
    const a = call('call_a', 'a', 'I will read both.');
    const b = call('call_b', 'b', 'I will read both.');
    const history: StoredEvent[] = [question, a, b, result(a, 'A'), result(b, 'B')];
    const c = call('call_c', 'c', '');
    history.push(c, result(c, 'C'), { ...events.agent('\n'), cause: question.id });
    const prompt = await buildLlmPrompt(contextOf(history), [], 5000);
    const shape = prompt.messages.map((m) =>
      m.role === 'tool_calls' ? { text: m.text, calls: m.calls.map((x) => x.result) } : m,
    );
    expect(shape).toEqual([
      { role: 'user', content: 'compare a and b' },
      { text: 'I will read both.', calls: ['A', 'B'] },
      { text: undefined, calls: ['C'] },
    ]);
  });

  it('cuts one huge event to fit instead of dropping everything before it', async () => {
    const history = [
      events.user('read the file'),
      events.toolCall('files__read', { path: 'a.txt' }, 'call_1'),
      events.toolResult('files__read', 'line of the file\n'.repeat(5000), 'call_1'),
    ];
    const prompt = await buildLlmPrompt(contextOf(history), [], 1000);
    expect(prompt.tokens).toBeLessThanOrEqual(1000);
    expect(prompt.messages.map((m) => m.role)).toEqual(['user', 'tool_calls']);
    expect(JSON.stringify(prompt.messages.at(-1))).toContain('cut to fit the context');
  });

  it("keeps the turn's own user message when the turn's tool results alone would fill the context", async () => {
    const first = events.user('hello');
    const history: StoredEvent[] = [
      first,
      { ...events.agent('hi, how can I help?'), cause: first.id },
    ];
    const question = events.user('QUESTION: compare a.txt and b.txt');
    history.push(question);
    for (const [n, file] of ['a.txt', 'b.txt'].entries()) {
      const call = {
        ...events.toolCall('files__read', { path: file }, `call_${n}`),
        cause: question.id,
      };
      history.push(call, {
        ...events.toolResult('files__read', `a line of ${file}\n`.repeat(5000), `call_${n}`),
        cause: call.id,
      });
    }
    const prompt = await buildLlmPrompt(contextOf(history), [], 1000);
    expect(prompt.tokens).toBeLessThanOrEqual(1000);
    expect(recount(prompt.system, prompt.messages)).toBeLessThanOrEqual(1000);
    // The answer, the first call and its result did not fit; the question is kept before the second call.
    expect(prompt.leftOut).toBe(3);
    expect(prompt.messages.slice(0, 3)).toEqual([
      { role: 'user', content: 'hello' },
      { role: 'user', content: leftOutNote(3) },
      { role: 'user', content: 'QUESTION: compare a.txt and b.txt' },
    ]);
    expect(
      prompt.messages.slice(3).map((m) => (m.role === 'tool_calls' ? m.calls[0]?.id : m.role)),
    ).toEqual(['call_1']);
  });

  it('reads the first user message once per conversation when given a memory', async () => {
    const history = longConversation(60);
    const memory = {};
    const first = contextOf(history);
    const before = await buildLlmPrompt(first, [], 600, memory);
    const firstReads = first.history.read;
    const again = contextOf(history);
    const after = await buildLlmPrompt(again, [], 600, memory);
    expect(after.messages).toEqual(before.messages);
    expect(after.messages[0]).toEqual({
      role: 'user',
      content: 'FIRST: plan the migration of our billing system',
    });
    // The second build skips the scan from the start.
    expect(again.history.read).toBeLessThan(firstReads);
  });

  it('refuses when the instructions alone do not fit', async () => {
    const context = contextOf([events.user('hi')], { instructions: 'rule. '.repeat(500) });
    await expect(buildLlmPrompt(context, [], 300)).rejects.toBeInstanceOf(PromptTooLargeError);
  });

  it('counts special-token strings in user text as plain text', async () => {
    const prompt = await buildLlmPrompt(contextOf([events.user('a <|endoftext|> b')]), [], 1000);
    expect(prompt.messages).toEqual([{ role: 'user', content: 'a <|endoftext|> b' }]);
    expect(truncateToTokens('<|endoftext|> and more text here', 3).length).toBeGreaterThan(0);
  });
});
