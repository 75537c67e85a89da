import { describe, expect, it } from 'vitest';
import { readAgentStateChange } from '@cs/protocol';
import { parseReplay, withReplayedMarkers } from './conversation-replay.js';

const states = (json: unknown[]) =>
  withReplayedMarkers(parseReplay(JSON.stringify(json))).map((draft) => [
    draft.source,
    readAgentStateChange(draft.body)?.agentState ?? null,
    draft.cause ?? null,
  ]);

const user = { source: 'user', action: 'message', args: { content: 'hi' }, message: '' };
const agent = { action: 'message', args: { content: 'hello' }, message: '' };
const change = (agent_state: string) => ({
  observation: 'agent_state_changed',
  content: '',
  extras: { agent_state },
  message: '',
});

describe('withReplayedMarkers', () => {
  it('marks each replayed user event answered', () => {
    expect(states([user, agent])).toEqual([
      ['user', null, null],
      ['environment', 'awaiting_user_input', 0],
      ['agent', null, null],
    ]);
  });

  it('ends a replay whose last state change leaves the agent running, pending or paused awaiting input', () => {
    for (const last of ['running', 'awaiting_user_confirmation', 'paused', 'loading']) {
      expect(states([user, agent, change(last)]).at(-1)).toEqual([
        'environment',
        'awaiting_user_input',
        0,
      ]);
    }
    // Without a user event the marker has no cause.
    expect(states([change('running')])).toEqual([
      ['environment', 'running', null],
      ['environment', 'awaiting_user_input', null],
    ]);
  });

  it('adds nothing when the replay leaves the agent awaiting input', () => {
    expect(states([user, agent, change('running'), change('awaiting_user_input')])).toHaveLength(5);
  });
});
