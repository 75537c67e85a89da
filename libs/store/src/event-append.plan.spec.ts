import type { EventDraft } from '@cs/core';
import { BadRequestError, ConflictError } from '@cs/core';
import { describe, expect, it } from 'vitest';
import { eventRowsJson, foldDeltas, planAppend, prepareDraft } from './event-append.plan.js';
import type { StoredEventRow } from './repositories/event.repository.js';

const message = (content: string, extra: Partial<EventDraft> = {}): EventDraft => ({
  source: 'user',
  body: { action: 'message', args: { content }, message: content },
  ...extra,
});

describe('prepareDraft', () => {
  it('stores the body without envelope keys, as it reads back from jsonb', () => {
    const prepared = prepareDraft({
      source: 'agent',
      body: {
        action: 'message',
        args: { content: 'hi', dropped: undefined },
        message: '',
        id: 5,
        timestamp: 'x',
      } as unknown as EventDraft['body'],
      cause: 3,
    });
    expect(prepared).toMatchObject({
      source: 'agent',
      type: 'message',
      payload: { action: 'message', args: { content: 'hi' }, message: '' },
      cause: 3,
      clientEventId: null,
      agentState: null,
    });
    expect(prepared.payload).not.toHaveProperty('id');
    expect(prepared.payload).not.toHaveProperty('timestamp');
  });

  it('reads the agent state of an agent_state_changed observation', () => {
    const prepared = prepareDraft({
      source: 'environment',
      body: {
        observation: 'agent_state_changed',
        content: '',
        extras: { agent_state: 'running' },
        message: '',
      },
    });
    expect(prepared).toMatchObject({ type: 'agent_state_changed', agentState: 'running' });
  });

  it('refuses malformed drafts', () => {
    const bad: EventDraft[] = [
      { ...message('x'), source: 'robot' as EventDraft['source'] },
      { source: 'user', body: {} as EventDraft['body'] },
      message('x', { cause: -1 }),
      message('x', { cause: 1.5 }),
      message('x', { clientEventId: '' }),
      message('x', { clientEventId: 'k'.repeat(129) }),
      {
        source: 'environment',
        body: {
          observation: 'agent_state_changed',
          content: '',
          extras: { agent_state: 'dancing' },
          message: '',
        },
      },
    ];
    for (const draft of bad) expect(() => prepareDraft(draft)).toThrow(BadRequestError);
  });
});

describe('planAppend', () => {
  const storedRow = (id: number, draft: EventDraft): StoredEventRow => {
    const prepared = prepareDraft(draft);
    return {
      event: { id, timestamp: 't', source: prepared.source, ...prepared.payload } as never,
      source: prepared.source,
      payload: prepared.payload,
    };
  };

  it('assigns ids from the next one to new drafts only', () => {
    const stored = new Map([['k1', storedRow(4, message('old', { clientEventId: 'k1' }))]]);
    const plan = planAppend(
      [
        message('a'),
        message('old', { clientEventId: 'k1' }),
        message('b', { clientEventId: 'k2' }),
        message('b', { clientEventId: 'k2' }),
      ].map(prepareDraft),
      stored,
      7,
    );
    expect(plan.fresh.map((row) => row.id)).toEqual([7, 8]);
    expect(plan.outcomes).toEqual([
      { kind: 'new', index: 0, duplicate: false },
      { kind: 'stored', event: stored.get('k1')!.event },
      { kind: 'new', index: 1, duplicate: false },
      { kind: 'new', index: 1, duplicate: true },
    ]);
  });

  it('treats a reused key with other content or source as a conflict', () => {
    const stored = new Map([['k1', storedRow(0, message('old', { clientEventId: 'k1' }))]]);
    expect(() =>
      planAppend([prepareDraft(message('new', { clientEventId: 'k1' }))], stored, 1),
    ).toThrow(ConflictError);
    expect(() =>
      planAppend(
        [prepareDraft({ ...message('old', { clientEventId: 'k1' }), source: 'agent' })],
        stored,
        1,
      ),
    ).toThrow(ConflictError);
    expect(() =>
      planAppend(
        [
          prepareDraft(message('x', { clientEventId: 'k2' })),
          prepareDraft(message('y', { clientEventId: 'k2' })),
        ],
        new Map(),
        0,
      ),
    ).toThrow(ConflictError);
  });
});

describe('eventRowsJson', () => {
  it('writes the rows of a plan as a JSON array, each payload serialized once and measured in UTF-8 bytes', () => {
    const key = 'quote " and \\ backslash';
    const drafts = [
      message('one "quoted" ünïcode', { clientEventId: key }),
      {
        ...message('two'),
        source: 'agent' as const,
        cause: 0,
        stateDelta: { color: 'red', gone: null, 'user:u': 1, 'temp:t': 1 },
      },
    ].map(prepareDraft);
    const { fresh } = planAppend(drafts, new Map(), 4);
    expect(JSON.parse(eventRowsJson(fresh))).toEqual([
      {
        id: 4,
        source: 'user',
        type: 'message',
        payload: drafts[0]!.payload,
        size_bytes: Buffer.byteLength(JSON.stringify(drafts[0]!.payload)),
        cause: null,
        client_event_id: key,
        state_delta: null,
      },
      {
        id: 5,
        source: 'agent',
        type: 'message',
        payload: drafts[1]!.payload,
        size_bytes: Buffer.byteLength(JSON.stringify(drafts[1]!.payload)),
        cause: 0,
        client_event_id: null,
        // Only the conversation scope: what a fork or rewind rebuilds.
        state_delta: { color: 'red', gone: null },
      },
    ]);
  });
});

describe('foldDeltas', () => {
  it('splits keys by scope, lets later values win, and turns null into a deletion', () => {
    const folded = foldDeltas(
      [
        message('1', {
          stateDelta: { a: 1, b: 2, 'user:u': 1, 'app:x': 1, 'temp:t': 1 },
          metricsDelta: { iterations: 1, cost_usd: 0.5 },
        }),
        message('2', {
          stateDelta: { a: null, b: 3, 'user:u': null },
          metricsDelta: { iterations: 1, prompt_tokens: 7 },
        }),
      ].map(prepareDraft),
    );
    expect(JSON.parse(folded.conversation.set)).toEqual({ b: 3 });
    expect(folded.conversation.deleted).toEqual(['a']);
    expect(JSON.parse(folded.user.set)).toEqual({});
    expect(folded.user).toMatchObject({ deleted: ['u'], empty: false });
    expect(JSON.parse(folded.app.set)).toEqual({ x: 1 });
    expect(folded.metrics).toEqual({
      iterations: 2,
      prompt_tokens: 7,
      completion_tokens: 0,
      cost_usd: 0.5,
    });
    expect(folded.agentState).toBeNull();
  });

  it('reports empty scopes so that their tables are not touched', () => {
    const folded = foldDeltas([prepareDraft(message('x', { stateDelta: { 'temp:x': 1 } }))]);
    expect([folded.conversation.empty, folded.user.empty, folded.app.empty]).toEqual([
      true,
      true,
      true,
    ]);
  });

  it("folds the steps' cost of one turn to add to the row's, and of a turn it moves on to to replace it", () => {
    const usage = (cause: number, cost_usd: number) =>
      prepareDraft(message('step', { source: 'agent', cause, metricsDelta: { cost_usd } }));
    expect(foldDeltas([prepareDraft(message('no usage', { cause: 3 }))]).turnCost).toBeNull();
    expect(foldDeltas([usage(3, 0.25), usage(3, 0.5)]).turnCost).toEqual({
      cause: 3,
      costUsd: 0.75,
      continues: true,
    });
    expect(foldDeltas([usage(3, 0.25), usage(4, 0.5)]).turnCost).toEqual({
      cause: 4,
      costUsd: 0.5,
      continues: false,
    });
  });

  it('refuses metrics that are not finite numbers', () => {
    expect(() =>
      foldDeltas([prepareDraft(message('x', { metricsDelta: { iterations: Number.NaN } }))]),
    ).toThrow(BadRequestError);
  });
});
