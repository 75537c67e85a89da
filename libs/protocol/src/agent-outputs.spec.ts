import { describe, expect, it } from 'vitest';
import { AgentOutputSchema } from './agent-outputs.js';
import { MAX_AGENT_MESSAGE_CHARS, MAX_JSON_DEPTH, MAX_PAYLOAD_BYTES } from './limits.js';

describe('AgentOutputSchema', () => {
  it("takes an event of the agent's own, and refuses one of the kinds the runtime stores", () => {
    const event = (body: Record<string, unknown>) =>
      AgentOutputSchema.safeParse({ type: 'event', body });
    expect(event({ action: 'search', args: { q: 'x' }, message: 'searching' }).success).toBe(true);
    expect(
      event({ observation: 'search_results', content: '3', extras: {}, message: '' }).success,
    ).toBe(true);
    for (const body of [
      { action: 'message', args: { content: 'a second answer' }, message: '' },
      { action: 'tool_call', args: { tool: 'charge' }, message: '' },
      { observation: 'tool_result', content: 'ok', extras: {}, message: '' },
      {
        observation: 'agent_state_changed',
        content: '',
        extras: { agent_state: 'finished' },
        message: '',
      },
    ]) {
      const parsed = event(body);
      expect(parsed.success).toBe(false);
      expect(parsed.error?.issues[0]?.message).toMatch(/stored by the runtime/);
    }
  });

  /** `{ a: { a: … } }` holding `depth` objects. */
  const nested = (depth: number): Record<string, unknown> => {
    let value: Record<string, unknown> = {};
    for (let i = 1; i < depth; i += 1) value = { a: value };
    return value;
  };

  it('refuses an output nested deeper than a client may send, without recursing into it', () => {
    // The output's own braces count, as a REST body's do: its delta is one level down.
    expect(
      AgentOutputSchema.safeParse({ type: 'state', delta: nested(MAX_JSON_DEPTH - 1) }).success,
    ).toBe(true);
    for (const depth of [MAX_JSON_DEPTH, 100_000]) {
      for (const output of [
        { type: 'state', delta: nested(depth) },
        { type: 'tool_call', tool: 't', arguments: nested(depth) },
      ]) {
        const parsed = AgentOutputSchema.safeParse(output);
        expect(parsed.success).toBe(false);
        expect(parsed.error?.issues[0]?.message).toMatch(/nested more than 32 deep/);
      }
    }
  });

  it('refuses text Postgres cannot store anywhere but in a delta (a pair may be split across two)', () => {
    for (const output of [
      { type: 'message', content: 'a\u0000b' },
      { type: 'message', content: 'half \ud83d' },
      { type: 'state', delta: { 'k\u0000': 1 } },
      { type: 'tool_call', tool: 't', arguments: { q: ['ok', '\ude00'] } },
      { type: 'finish', reason: '\u0000' },
    ]) {
      const parsed = AgentOutputSchema.safeParse(output);
      expect(parsed.success).toBe(false);
      expect(parsed.error?.issues[0]?.message).toMatch(/cannot be stored/);
    }
    expect(AgentOutputSchema.safeParse({ type: 'delta', delta: '\ud83d' }).success).toBe(true);
    expect(
      AgentOutputSchema.safeParse({ type: 'message', content: 'ok \ud83d\ude00' }).success,
    ).toBe(true);
  });

  it('refuses an output larger than a client may send', () => {
    const big = 'x'.repeat(MAX_PAYLOAD_BYTES);
    const parsed = AgentOutputSchema.safeParse({ type: 'state', delta: { big } });
    expect(parsed.success).toBe(false);
    expect(parsed.error?.issues[0]?.message).toMatch(/larger than/);
    expect(
      AgentOutputSchema.safeParse({ type: 'state', delta: { big: big.slice(100) } }).success,
    ).toBe(true);
  });

  it("takes a message as long as an agent's message may be, past a client's payload size", () => {
    const content = '中'.repeat(MAX_AGENT_MESSAGE_CHARS);
    expect(AgentOutputSchema.safeParse({ type: 'message', content }).success).toBe(true);
  });
});
