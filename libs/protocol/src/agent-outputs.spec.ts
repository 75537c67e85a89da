import { describe, expect, it } from 'vitest';
import { AgentOutputSchema } from './agent-outputs.js';

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
});
