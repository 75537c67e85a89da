import { describe, expect, it } from 'vitest';
import { isAgentBusy } from './agent-busy.js';

describe('isAgentBusy', () => {
  it('is busy while a turn runs, whatever is stored', () => {
    expect(isAgentBusy({ agentState: 'running', unansweredMessages: () => 0 })).toBe(true);
  });

  it('is busy when a message waits for its turn, and free when none does', () => {
    expect(isAgentBusy({ agentState: 'awaiting_user_input', unansweredMessages: () => 1 })).toBe(
      true,
    );
    expect(isAgentBusy({ agentState: 'awaiting_user_input', unansweredMessages: () => 0 })).toBe(
      false,
    );
    expect(isAgentBusy({ agentState: null, unansweredMessages: () => 0 })).toBe(false);
  });

  it('takes a reply to tool calls awaiting approval, but not a second one', async () => {
    // The pending turn's own message is the one unanswered.
    expect(
      isAgentBusy({ agentState: 'awaiting_user_confirmation', unansweredMessages: () => 1 }),
    ).toBe(false);
    expect(
      isAgentBusy({ agentState: 'awaiting_user_confirmation', unansweredMessages: () => 2 }),
    ).toBe(true);
    await expect(
      isAgentBusy({
        agentState: 'awaiting_user_confirmation',
        unansweredMessages: () => Promise.resolve(2),
      }),
    ).resolves.toBe(true);
  });

  it('does not count messages when the state decides', () => {
    let asked = false;
    isAgentBusy({
      agentState: 'running',
      unansweredMessages: () => {
        asked = true;
        return 0;
      },
    });
    expect(asked).toBe(false);
  });
});
