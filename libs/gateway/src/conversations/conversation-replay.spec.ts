import { describe, expect, it } from 'vitest';
import { readAgentStateChange } from '@cs/protocol';
import { parseReplay, replayDrafts } from './conversation-replay.js';

const states = (json: unknown[]) =>
  replayDrafts(parseReplay(JSON.stringify(json))).map((draft) => [
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

describe('replayDrafts', () => {
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
      parseReplay(JSON.stringify([{ ...user, args: { content: 'x'.repeat(262_144) } }])).events,
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
    expect(refusal(Array.from({ length: 1001 }, () => agent))).toEqual({
      message: 'replay_json holds at most 1000 events; this one has 1001',
      field: 'replay_json',
    });
    // An export's `{ state }` line is not an event.
    const exported = Array.from({ length: 1000 }, (_, id) => ({ ...agent, id }));
    expect(parseReplay(JSON.stringify([...exported, { state: {} }])).events).toHaveLength(1000);
  });

  it('keeps the default sources of actions and observations', () => {
    expect(
      parseReplay(JSON.stringify([agent, change('running')])).events.map((e) => e.draft.source),
    ).toEqual(['agent', 'environment']);
  });
});

describe('a replay of exported events (with their ids)', () => {
  /** Events 0: a, 1: its answer, 2: b, 3: its answer, 4: a rewind to 1, 5: c, 6: its answer. */
  const exported = (): Record<string, unknown>[] => [
    { id: 0, timestamp: 't', ...user, args: { content: 'a' }, client_event_id: 'k0' },
    { id: 1, timestamp: 't', source: 'agent', cause: 0, ...agent },
    { id: 2, timestamp: 't', ...user, args: { content: 'b' }, undone_by: 4 },
    { id: 3, timestamp: 't', source: 'agent', cause: 2, ...agent, undone_by: 4 },
    {
      id: 4,
      timestamp: 't',
      source: 'user',
      action: 'rewind',
      args: { to_event_id: 1 },
      message: '',
    },
    { id: 5, timestamp: 't', ...user, args: { content: 'c' } },
    { id: 6, timestamp: 't', source: 'agent', cause: 5, ...agent },
  ];
  const refusal = (events: unknown) => {
    try {
      parseReplay(JSON.stringify(events));
    } catch (error) {
      return { message: (error as Error).message, field: (error as { field?: string }).field };
    }
    throw new Error('accepted');
  };

  it('keeps ids and causes, adds no marker between them, and answers through the last user event', () => {
    const drafts = replayDrafts(parseReplay(JSON.stringify(exported())));
    expect(drafts).toHaveLength(7);
    expect(drafts.map((draft) => draft.cause ?? null)).toEqual([null, 0, null, 2, null, null, 5]);
    expect(drafts.map((draft) => draft.answers ?? null)).toEqual([
      null,
      null,
      null,
      null,
      null,
      null,
      5,
    ]);
    // The envelope is not part of the body.
    expect(drafts[0]!.body).toEqual({ action: 'message', args: { content: 'a' }, message: '' });
    expect(drafts[4]).toMatchObject({ source: 'user', body: { action: 'rewind' } });
  });

  it('ends with a settled state change after them only when the agent was left unsettled', () => {
    const running = [...exported(), { id: 7, ...change('running'), cause: 5 }];
    const drafts = replayDrafts(parseReplay(JSON.stringify(running)));
    expect(drafts).toHaveLength(9);
    expect(drafts[8]).toMatchObject({ cause: 5, answers: 5 });
    expect(readAgentStateChange(drafts[8]!.body)?.agentState).toBe('awaiting_user_input');
  });

  it("sets the trailing state's conversation keys, not the user's nor the app's", () => {
    const replay = parseReplay(
      JSON.stringify([...exported(), { state: { color: 'red', 'user:seen': true, 'app:x': 1 } }]),
    );
    expect(replay.state).toEqual({ color: 'red' });
    expect(replayDrafts(replay).at(-1)!.stateDelta).toEqual({ color: 'red' });
    expect(replayDrafts(parseReplay('[{"state":{"k":1}}]'))).toMatchObject([
      { stateDelta: { k: 1 } },
    ]);
    expect(refusal([...exported(), { state: 'red' }]).field).toBe('replay_json[7].state');
    expect(refusal([{ state: {} }, ...exported()]).field).toBe('replay_json[0]');
  });

  it('refuses ids out of place, a cause after its event, and marks the rewinds do not make', () => {
    const events = exported();
    expect(refusal([events[0], events[2]])).toEqual({
      message:
        'replay_json[1].id: must be 1: the events are replayed with every id, in order from 0',
      field: 'replay_json[1].id',
    });
    const { id: _id, ...withoutId } = events[1]!;
    expect(refusal([events[0], withoutId]).field).toBe('replay_json[1].id');
    expect(refusal([events[0], { ...events[1], cause: 1 }]).field).toBe('replay_json[1].cause');
    // undone_by must be the mark the rewinds make, when given.
    const wrongMark = exported();
    wrongMark[5] = { ...wrongMark[5]!, undone_by: 4 };
    expect(refusal(wrongMark)).toEqual({
      message: 'replay_json[5].undone_by: no rewind among the events undid this one',
      field: 'replay_json[5].undone_by',
    });
    const otherMark = exported();
    otherMark[3] = { ...otherMark[3]!, undone_by: 6 };
    expect(refusal(otherMark).field).toBe('replay_json[3].undone_by');
    // Marks left out are the rewinds' all the same.
    const stripped = exported().map(({ undone_by: _u, ...event }) => event);
    expect(replayDrafts(parseReplay(JSON.stringify(stripped)))).toHaveLength(7);
  });

  it('refuses a rewind to no live event before it', () => {
    const events = exported();
    const later = [...events.slice(0, 4), { ...events[4]!, args: { to_event_id: 4 } }];
    expect(refusal(later).field).toBe('replay_json[4].args.to_event_id');
    const undone = [
      ...events,
      { id: 7, source: 'user', action: 'rewind', args: { to_event_id: 2 }, message: '' },
    ];
    expect(refusal(undone).field).toBe('replay_json[7].args.to_event_id');
    const notANumber = [...events.slice(0, 4), { ...events[4]!, args: { to_event_id: 'one' } }];
    expect(refusal(notANumber).field).toBe('replay_json[4].args.to_event_id');
  });

  it('refuses a rewind or an undone mark in events without ids: what it undid is lost', () => {
    const plain = exported().map(({ id: _id, undone_by: _u, ...event }) => event);
    expect(refusal(plain)).toEqual({
      message: "replay_json[4]: a rewind is replayed with the events' ids (an export's)",
      field: 'replay_json[4]',
    });
    expect(refusal([user, { ...agent, undone_by: 2 }]).field).toBe('replay_json[1].undone_by');
  });
});
