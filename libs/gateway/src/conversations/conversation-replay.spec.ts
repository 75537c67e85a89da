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

describe('parseReplay', () => {
  const refusal = (events: unknown) => {
    try {
      parseReplay(JSON.stringify(events));
    } catch (error) {
      return { message: (error as Error).message, field: (error as { field?: string }).field };
    }
    throw new Error('accepted');
  };

  it('names the event that is neither an action nor an observation', () => {
    expect(refusal([user, { source: 'user' }])).toEqual({
      message: 'replay_json[1]: an event has an "action" or an "observation"',
      field: 'replay_json[1]',
    });
    expect(refusal([42]).field).toBe('replay_json[0]');
  });

  it("names the field that is wrong by the event's own shape", () => {
    const bad = refusal([agent, { action: 'message', args: { content: 'hi' }, message: 7 }]);
    expect(bad.field).toBe('replay_json[1].message');
    expect(bad.message).toMatch(/^replay_json\[1\]\.message: /);
    expect(bad.message).toContain('expected string, received number');
    const observation = refusal([{ ...change('running'), content: 3 }]);
    expect(observation.field).toBe('replay_json[0].content');
  });

  it("holds each event to a live message's limits, naming its field", () => {
    const long = { ...agent, args: { content: 'x'.repeat(262_145) } };
    expect(refusal([user, agent, user, long])).toMatchObject({
      field: 'replay_json[3].args.content',
    });
    expect(refusal([{ ...user, args: { content: 'x'.repeat(900_000) } }]).field).toBe(
      'replay_json[0].args.content',
    );
    expect(refusal([{ ...user, args: {} }]).field).toBe('replay_json[0].args.content');
    expect(
      parseReplay(JSON.stringify([{ ...user, args: { content: 'x'.repeat(262_144) } }])),
    ).toHaveLength(1);
    expect(refusal([agent, { ...user, args: { content: 'a\u0000b' } }]).field).toBe(
      'replay_json[1].args.content',
    );
    expect(refusal([{ ...change('running'), content: '\ud800' }]).field).toBe(
      'replay_json[0].content',
    );
  });

  it('refuses an args or extras key __proto__ rather than dropping it', () => {
    const proto = '[{"action":"message","args":{"content":"hi","__proto__":{"x":1}},"message":""}]';
    expect(() => parseReplay(proto)).toThrow(
      expect.objectContaining({ field: 'replay_json[0].args.__proto__' }),
    );
  });

  it('refuses what is not a list, and more than 1,000 events, as replay_json', () => {
    expect(refusal({ action: 'message' }).field).toBe('replay_json');
    expect(refusal(Array.from({ length: 1001 }, () => agent)).field).toBe('replay_json');
  });

  it('keeps the default sources of actions and observations', () => {
    expect(parseReplay(JSON.stringify([agent, change('running')])).map((d) => d.source)).toEqual([
      'agent',
      'environment',
    ]);
  });
});
