import { describe, expect, it } from 'vitest';
import type { AgentContext } from '@cs/core';
import {
  AgentOutputSchema,
  MAX_AGENT_MESSAGE_CHARS,
  MAX_MESSAGE_CONTENT_CHARS,
  type AgentOutput,
  type StoredEvent,
} from '@cs/protocol';
import { EchoAgent } from './echo.agent.js';

function turnFor(trigger: StoredEvent): AgentContext {
  return {
    conversation_id: 'c-1',
    tenant_id: 't',
    user_id: 'u',
    history: {
      last_event_id: trigger.id,
      recent: () => Promise.resolve([trigger]),

      range: async function* () {
        yield trigger;
      },
    },
    state: {},
    instructions: null,
    tools: [],
    trigger,
    step: 1,
    signal: new AbortController().signal,
  };
}

function userMessage(content: string): StoredEvent {
  return {
    id: 4,
    timestamp: '2025-01-01T00:00:00.000Z',
    source: 'user',
    action: 'message',
    args: { content, image_urls: [], file_urls: [] },
    message: content,
  };
}

async function collect(outputs: AsyncIterable<AgentOutput>): Promise<AgentOutput[]> {
  const all: AgentOutput[] = [];
  for await (const output of outputs) all.push(output);
  return all;
}

describe(EchoAgent.name, () => {
  it('answers a user message with one agent message: "echo: " and the text verbatim', async () => {
    const text = '  Hello, wörld! 👋\n<b>"quoted"</b>  ';
    const outputs = await collect(new EchoAgent().step(turnFor(userMessage(text))));
    expect(outputs).toEqual([{ type: 'message', content: `echo: ${text}` }]);
  });

  it('answers the longest message a user may send with its whole text, within what an agent message may hold', async () => {
    const text = `${'x'.repeat(MAX_MESSAGE_CONTENT_CHARS - 2)}👋`;
    const outputs = await collect(new EchoAgent().step(turnFor(userMessage(text))));
    const content = (outputs[0] as { content: string }).content;
    expect(content).toBe(`echo: ${text}`);
    expect(content.length).toBeLessThanOrEqual(MAX_AGENT_MESSAGE_CHARS);
    expect(AgentOutputSchema.safeParse(outputs[0]).success).toBe(true);
  });

  it('is deterministic', async () => {
    const agent = new EchoAgent();
    const first = await collect(agent.step(turnFor(userMessage('same'))));
    const second = await collect(agent.step(turnFor(userMessage('same'))));
    expect(second).toEqual(first);
  });

  it('yields nothing for an event that is not a message', async () => {
    const control: StoredEvent = {
      id: 1,
      timestamp: '2025-01-01T00:00:00.000Z',
      source: 'user',
      action: 'change_agent_state',
      args: { agent_state: 'paused' },
      message: '',
    };
    expect(await collect(new EchoAgent().step(turnFor(control)))).toEqual([]);
  });
});
