import { randomUUID } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { isAction, isObservation } from '@cs/protocol';
import type { AgentState, EventBody, StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent, ConversationHistory } from './agent.js';
import {
  AGENT_FAILED_MESSAGE,
  AgentSession,
  OUTPUT_REFUSED_MESSAGE,
  STORE_FAILED_MESSAGE,
  SessionClosedError,
  type AgentSessionOptions,
} from './agent-session.js';
import { BadRequestError } from './errors.js';
import { refOf, type ConversationRef, type EventDraft } from './conversation.js';
import type { RuntimeMetrics } from './ports/runtime-metrics.port.js';
import { agentStateChangeDraft, readAgentStateChange } from './session/agent-state-change.js';
import { BUILTIN_TOOLS } from './tools/builtin-tools.js';
import { ToolRegistry } from './tools/tool-registry.js';
import {
  GatedAgent,
  ManualClock,
  RecordingBroadcaster,
  ScriptedAgent,
  echoTestAgent,
  messageText,
  say,
} from './testing/index.js';
import {
  type AppendHook,
  InMemoryConversationStore,
} from '../../../test/fakes/in-memory-conversation-store.js';

const CATCH_UP_MS = 1000;

/** An append hook that throws once, for the first append whose drafts match. */
function failOnce(
  matches: (drafts: readonly EventDraft[]) => boolean,
  message: string,
): AppendHook {
  let failed = false;
  return (_id, drafts) => {
    if (!failed && matches(drafts)) {
      failed = true;
      throw new Error(message);
    }
  };
}

/** Every event a turn's history gives, oldest first. */
async function events(history: ConversationHistory): Promise<StoredEvent[]> {
  const seen: StoredEvent[] = [];
  for await (const event of history.range(0, history.last_event_id)) seen.push(event);
  return seen;
}

async function ids(history: ConversationHistory): Promise<number[]> {
  return (await events(history)).map((e) => e.id);
}

const hasAgentEvent = (drafts: readonly EventDraft[]) => drafts.some((d) => d.source === 'agent');

async function fixture(title = 'test', agentConfig: Record<string, unknown> = {}) {
  const clock = new ManualClock();
  const store = new InMemoryConversationStore({ clock });
  const broadcaster = new RecordingBroadcaster();
  const { conversation: created } = await store.createConversation({
    id: randomUUID(),
    tenantId: `tenant-${randomUUID()}`,
    userId: 'user-1',
    appName: 'app',
    title,
    metadata: {},
    agent: { name: 'test', config: agentConfig },
    instructions: 'be brief',
  });
  const ref: ConversationRef = refOf(created);
  const reporting = { reportError: (_message: string, _error: unknown): void => undefined };

  /** A new session holding a freshly acquired lease (as a starting holder would). */
  async function newSession(
    agent: Agent,
    maxIterations = 10,
    catchUpIntervalMs = CATCH_UP_MS,
    maxBudgetUsd = 0,
    extra: Partial<AgentSessionOptions> = {},
  ): Promise<AgentSession> {
    const leaseEpoch = await store.acquireLease(ref.tenantId, ref.conversationId, 'test-owner');
    return new AgentSession({
      store,
      broadcaster,
      ref,
      leaseEpoch,
      agent,
      options: {
        maxIterations,
        maxBudgetUsd,
        clock,
        catchUpIntervalMs,
        reportError: (message, error) => reporting.reportError(message, error),
        ...extra,
      },
    });
  }

  async function appendUser(body: EventBody, session?: AgentSession) {
    const [appended] = await store.append(ref.tenantId, ref.conversationId, [
      { source: 'user', body },
    ]);
    session?.wake();
    return appended!.event.id;
  }

  const userSays = (text: string, session?: AgentSession) =>
    appendUser({ action: 'message', args: { content: text }, message: text }, session);

  const userRequests = (
    agentState: 'stopped' | 'paused' | 'running' | 'user_confirmed' | 'user_rejected',
    session?: AgentSession,
  ) =>
    appendUser(
      { action: 'change_agent_state', args: { agent_state: agentState }, message: '' },
      session,
    );

  const events = () => store.allEvents(ref.conversationId);

  /** Stored agent state changes as `[state, cause]` (cause null when none). */
  const states = () =>
    events().flatMap((e): [AgentState, number | null, string | undefined][] => {
      const change = readAgentStateChange(e);
      return change ? [[change.agentState, e.cause ?? null, change.reason]] : [];
    });

  /** The agent's stored messages as `[content, cause]`. */
  const answers = () =>
    events().flatMap((e): [string, number | null][] =>
      e.source === 'agent' && isAction(e) && e.action === 'message'
        ? [[messageText(e), e.cause ?? null]]
        : [],
    );

  return {
    set reportError(report: (message: string, error: unknown) => void) {
      reporting.reportError = report;
    },
    clock,
    store,
    broadcaster,
    ref,
    newSession,
    userSays,
    userRequests,
    events,
    states,
    answers,
  };
}

describe(AgentSession.name, () => {
  it('stores loading then awaiting_user_input on start, and running, the answer and awaiting_user_input for a message', async () => {
    const f = await fixture();
    const session = await f.newSession(echoTestAgent());
    await session.start();
    expect(f.states()).toEqual([
      ['loading', null, undefined],
      ['awaiting_user_input', null, undefined],
    ]);
    expect(session.agentState).toBe('awaiting_user_input');

    const messageId = await f.userSays('hello world', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));

    const stored = f
      .events()
      .map((e) => [
        e.id,
        e.source,
        isAction(e) ? e.action : readAgentStateChange(e)?.agentState,
        e.cause ?? null,
      ]);
    expect(stored).toEqual([
      [0, 'environment', 'loading', null],
      [1, 'environment', 'awaiting_user_input', null],
      [2, 'user', 'message', null],
      [3, 'environment', 'running', messageId],
      [4, 'agent', 'message', messageId],
      [5, 'environment', 'awaiting_user_input', messageId],
    ]);
    expect(f.answers()).toEqual([['echo: hello world', messageId]]);
    expect(session.agentState).toBe('awaiting_user_input');
    // Every write carries the lease epoch; the user's event carries none.
    expect(f.store.leaseEpochs(f.ref.conversationId)).toEqual([1, 1, null, 1, 1, 1]);
    const snapshot = await f.store.getSnapshot(f.ref.tenantId, f.ref.conversationId);
    expect(snapshot?.conversation.metrics.iterations).toBe(1);
    expect(snapshot?.conversation.agentState).toBe('awaiting_user_input');
    await session.close();
  });

  it('publishes every event it stores, once, in id order, and never the user events', async () => {
    const f = await fixture();
    const session = await f.newSession(echoTestAgent());
    await session.start();
    await f.userSays('one', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
    await f.userSays('two', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(2));

    const published = f.broadcaster.eventsOf(f.ref.conversationId).map((e) => e.id);
    const written = f
      .events()
      .filter((e) => e.source !== 'user')
      .map((e) => e.id);
    expect(published).toEqual(written);
    await session.close();
  });

  it('answers a message that comes with its wake-up without reading the store, and its history holds the earlier turns', async () => {
    const f = await fixture();
    const agent = echoTestAgent();
    const session = await f.newSession(agent);
    await session.start();
    const reads = vi.spyOn(f.store, 'readEvents');
    for (const text of ['one', 'two']) {
      const [appended] = await f.store.append(f.ref.tenantId, f.ref.conversationId, [
        { source: 'user', body: { action: 'message', args: { content: text }, message: text } },
      ]);
      session.wake([appended!.event]);
      await vi.waitFor(() => expect(f.answers().at(-1)?.[0]).toBe(`echo: ${text}`));
    }
    expect(reads).not.toHaveBeenCalled();
    // The second turn sees the first one's answer, which the session kept from its own write.
    const seen = await ids(agent.turns[1]!.history);
    expect(reads).not.toHaveBeenCalled();
    expect(seen).toEqual(
      f
        .events()
        .slice(0, 7)
        .map((e) => e.id),
    );
    await session.close();
  });

  it('reads the store when a wake-up skips events it has not seen', async () => {
    const f = await fixture();
    const session = await f.newSession(echoTestAgent());
    await session.start();
    const first = await f.userSays('first');
    const [second] = await f.store.append(f.ref.tenantId, f.ref.conversationId, [
      {
        source: 'user',
        body: { action: 'message', args: { content: 'second' }, message: 'second' },
      },
    ]);
    session.wake([second!.event]);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
    expect(f.answers()).toEqual([
      ['echo: first', first],
      ['echo: second', second!.event.id],
    ]);
    await session.close();
  });

  it('answers messages stored before it started, and gives the agent history, state and instructions', async () => {
    const f = await fixture();
    const first = await f.userSays('first');
    const second = await f.userSays('second');
    const agent = echoTestAgent();
    const session = await f.newSession(agent);
    await session.start();
    await vi.waitFor(() => expect(f.answers()).toHaveLength(2));

    expect(f.answers()).toEqual([
      ['echo: first', first],
      ['echo: second', second],
    ]);
    const [turn1, turn2] = agent.turns;
    expect(turn1?.trigger.id).toBe(first);
    expect(turn1?.instructions).toBe('be brief');
    const seen1 = await events(turn1!.history);
    expect(seen1.map((e) => e.id)).toContain(first);
    // The message queued behind the first is not in the first turn's history.
    expect(seen1.some((e) => e.id === second)).toBe(false);
    // The second turn sees everything up to its message and the first answer
    // (stored after it), but nothing of its own turn.
    const seen2 = await events(turn2!.history);
    const seenIds = seen2.map((e) => e.id);
    expect(seenIds).toEqual([...seenIds].sort((a, b) => a - b));
    expect(seenIds.slice(0, second + 1)).toEqual([...Array(second + 1).keys()]);
    expect(seen2.some((e) => e.source === 'agent' && e.cause === first)).toBe(true);
    expect(seen2.some((e) => e.id > second && e.cause === second)).toBe(false);
    // recent() gives the last of those, oldest first.
    expect((await turn2!.history.recent(2)).map((e) => e.id)).toEqual(seenIds.slice(-2));
    await session.close();
  });

  it("gives a turn the history as of the turn's start, however late its agent reads it", async () => {
    const f = await fixture();
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let waiting!: () => void;
    const agentWaits = new Promise<void>((resolve) => (waiting = resolve));
    let seen: number[] = [];
    const agent = new ScriptedAgent(async function* (turn) {
      yield { type: 'delta', delta: 'thinking' };
      waiting();
      await released;
      seen = await ids(turn.history);
      yield say('done');
    });
    const session = await f.newSession(agent);
    await session.start();
    const trigger = await f.userSays('hello', session);
    await agentWaits;
    // Stored during the turn, with no cause: a turn that looked now would see it.
    const [note] = await f.store.append(f.ref.tenantId, f.ref.conversationId, [
      {
        source: 'environment',
        body: { observation: 'note', content: 'meanwhile', extras: {}, message: '' },
      },
    ]);
    session.wake([note!.event]);
    expect(session.lastEventId).toBe(note!.event.id);
    release();
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));

    expect(seen).toEqual([...Array(trigger + 1).keys()]);
    expect(f.answers()).toEqual([['done', trigger]]);
    await session.close();
  });

  it('publishes token deltas as ephemeral stream messages, never stored', async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* () {
      yield { type: 'delta', delta: 'he' };
      await Promise.resolve();
      yield { type: 'delta', delta: 'llo' };
      yield say('hello');
    });
    const session = await f.newSession(agent);
    await session.start();
    const messageId = await f.userSays('hi', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));

    expect(f.broadcaster.streamsOf(f.ref.conversationId)).toEqual([
      { stream: true, cause: messageId, delta: 'he', offset: 0 },
      { stream: true, cause: messageId, delta: 'llo', offset: 2 },
    ]);
    expect(f.events().some((e) => JSON.stringify(e).includes('"llo"'))).toBe(false);
    await session.close();
  });

  it('stores one message for a turn that ends with one: the streamed text under an empty final message, or the empty message itself', async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* (turn) {
      await Promise.resolve();
      if (messageText(turn.trigger) === 'stream') yield { type: 'delta', delta: 'shown' };
      yield say('');
    });
    const session = await f.newSession(agent);
    await session.start();
    const streamed = await f.userSays('stream', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
    const silent = await f.userSays('silent', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
    expect(f.answers()).toEqual([
      ['shown', streamed],
      ['', silent],
    ]);
    expect(f.states().at(-1)?.[0]).toBe('awaiting_user_input');
    await session.close();
  });

  it("stores a step's text with its first tool call only, once", async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* (turn) {
      await Promise.resolve();
      if (turn.step > 1) {
        yield say('done');
        return;
      }
      yield { type: 'delta', delta: 'Let me check both.' };
      yield { type: 'tool_call', tool: 'current_time', arguments: {} };
      yield { type: 'tool_call', tool: 'current_time', arguments: {} };
    });
    const session = await f.newSession(agent);
    await session.start();
    await f.userSays('go', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
    const calls = f.events().filter((e) => 'action' in e && e.action === 'tool_call');
    expect(calls.map((e) => e.message)).toEqual(['Let me check both.', '']);
    await session.close();
  });

  it('keeps what a step yielded before it failed: its events and their state, with the error', async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* () {
      await Promise.resolve();
      yield {
        type: 'event',
        body: { observation: 'error', content: 'line 1 is not JSON', extras: {}, message: '' },
      };
      yield { type: 'state', delta: { seen: 1 } };
      throw new Error('the agent broke');
    });
    const session = await f.newSession(agent);
    await session.start();
    const messageId = await f.userSays('go', session);
    await vi.waitFor(() => expect(session.agentState).toBe('error'));
    const tail = f.events().slice(-2);
    expect(tail.map((e) => ('observation' in e ? e.observation : e.action))).toEqual([
      'error',
      'agent_state_changed',
    ]);
    expect(tail[0]).toMatchObject({ content: 'line 1 is not JSON', cause: messageId });
    expect(f.states().at(-1)).toEqual(['error', messageId, 'agent_error']);
    await session.close();
  });

  it("stores a step's events, its answer and the settled state in one batch", async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* () {
      yield {
        type: 'event',
        body: { observation: 'note', content: 'looked it up', extras: {}, message: '' },
      };
      await new Promise((resolve) => setTimeout(resolve, 30));
      yield say('done');
    });
    const session = await f.newSession(agent);
    await session.start();
    const messageId = await f.userSays('go', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
    await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_input'));

    const tail = f.events().slice(-4);
    expect(
      tail.map((e) =>
        isAction(e) ? messageText(e) : (readAgentStateChange(e)?.agentState ?? e.observation),
      ),
    ).toEqual(['running', 'note', 'done', 'awaiting_user_input']);
    // The step's outputs, the answer and the settled state were one batch (one publish).
    const batches = f.broadcaster.sent.filter((b) => b.kind === 'events');
    expect(batches.at(-1)?.kind === 'events' && batches.at(-1)).toMatchObject({
      events: [
        { cause: messageId, observation: 'note' },
        { cause: messageId, action: 'message' },
        { cause: messageId, observation: 'agent_state_changed' },
      ],
    });
    const snapshot = await f.store.getSnapshot(f.ref.tenantId, f.ref.conversationId);
    expect(snapshot?.conversation.metrics.iterations).toBe(1);
    expect(snapshot?.conversation.answeredThrough).toBe(messageId);
    await session.close();
  });

  it('keeps temp: keys in memory for the agent and stores the other scopes', async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* (turn) {
      const seen = typeof turn.state['temp:seen'] === 'number' ? turn.state['temp:seen'] : 0;
      await Promise.resolve();
      yield {
        type: 'state',
        delta: { 'temp:seen': seen + 1, count: seen + 1, 'user:name': 'ada' },
      };
      yield say(`seen ${seen}`);
    });
    const session = await f.newSession(agent);
    await session.start();
    await f.userSays('a', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
    await f.userSays('b', session);
    await vi.waitFor(() => expect(f.answers()).toHaveLength(2));

    expect(f.answers().map(([text]) => text)).toEqual(['seen 0', 'seen 1']);
    expect(session.sessionState).toMatchObject({ 'temp:seen': 2, count: 2, 'user:name': 'ada' });
    const snapshot = await f.store.getSnapshot(f.ref.tenantId, f.ref.conversationId);
    expect(snapshot?.state).toEqual({ count: 2, 'user:name': 'ada' });
    await session.close();
  });

  describe('app: and user: keys another conversation stored', () => {
    type Fixture = Awaited<ReturnType<typeof fixture>>;

    /** Another conversation of the fixture's user in its app, and what storing keys there tells. */
    async function sibling(f: Fixture) {
      const { conversation } = await f.store.createConversation({
        id: randomUUID(),
        tenantId: f.ref.tenantId,
        userId: f.ref.userId,
        appName: 'app',
        title: 'sibling',
        metadata: {},
        agent: { name: 'test', config: {} },
        instructions: null,
      });
      const change = {
        tenantId: f.ref.tenantId,
        appName: 'app',
        userId: f.ref.userId,
        app: false,
        user: true,
        origin: conversation.id,
      };
      return {
        change,
        /** Stores the delta in the sibling, as its own session would. */
        stores: (stateDelta: Record<string, unknown>) =>
          f.store.append(f.ref.tenantId, conversation.id, [
            {
              source: 'agent',
              body: { action: 'message', args: { content: '' }, message: '' },
              stateDelta,
            },
          ]),
      };
    }

    /** Answers with the `user:color` its step was given. */
    const colorTeller = () =>
      new ScriptedAgent(async function* (turn) {
        await Promise.resolve();
        yield say(`color: ${String(turn.state['user:color'])}`);
      });

    it('reads them again before its next step once told, and reads nothing otherwise', async () => {
      const f = await fixture();
      const other = await sibling(f);
      const read = vi.spyOn(f.store, 'getScopedState');
      const session = await f.newSession(colorTeller());
      await session.start();
      await f.userSays('one', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
      await other.stores({ 'user:color': 'teal' });
      // Not told: the copy read at start, and no read on the way.
      await f.userSays('two', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
      expect(read).not.toHaveBeenCalled();

      session.scopedStateChanged(other.change);
      await f.userSays('three', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(3));
      await f.userSays('four', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(4));
      expect(f.answers().map(([text]) => text)).toEqual([
        'color: undefined',
        'color: undefined',
        'color: teal',
        'color: teal',
      ]);
      expect(read).toHaveBeenCalledTimes(1);
      await session.close();
    });

    it('sees a change told during a step from the next step of the same turn, its plain and temp: keys kept', async () => {
      const f = await fixture();
      const other = await sibling(f);
      let session: AgentSession | null = null;
      const agent = new ScriptedAgent(async function* (turn) {
        if (turn.step === 1) {
          yield { type: 'state', delta: { plain: 'mine', 'temp:t': 1 } };
          await other.stores({ 'user:color': 'teal', 'app:motd': 'hello' });
          session?.scopedStateChanged(other.change);
          yield { type: 'tool_call', tool: 'current_time', arguments: {} };
          return;
        }
        const { state } = turn;
        yield say(
          `${String(state['plain'])} ${String(state['temp:t'])} ${String(state['user:color'])}`,
        );
      });
      session = await f.newSession(agent);
      await session.start();
      await f.userSays('go', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
      expect(f.answers()[0]?.[0]).toBe('mine 1 teal');
      // Both scopes are read: the app: key came along.
      expect(session.sessionState).toMatchObject({
        'user:color': 'teal',
        'app:motd': 'hello',
      });
      await session.close();
    });

    it("ignores what it does not share: its own change, another user's user: keys, another app or tenant", async () => {
      const f = await fixture();
      const other = await sibling(f);
      const read = vi.spyOn(f.store, 'getScopedState');
      const session = await f.newSession(colorTeller());
      await session.start();
      for (const change of [
        { ...other.change, origin: f.ref.conversationId },
        { ...other.change, userId: 'someone-else' },
        { ...other.change, appName: 'other-app', app: true },
        { ...other.change, tenantId: 'other-tenant', app: true },
      ])
        session.scopedStateChanged(change);
      await f.userSays('one', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
      expect(read).not.toHaveBeenCalled();
      await session.close();
    });

    it('tells onScopedStateChange after a write that stored app: or user: keys, and only then', async () => {
      const f = await fixture();
      const told = vi.fn();
      const agent = new ScriptedAgent(async function* (turn) {
        await Promise.resolve();
        const text = messageText(turn.trigger);
        yield {
          type: 'state',
          delta: text === 'shared' ? { 'user:color': 'red', plain: 1 } : { plain: 2, 'temp:t': 1 },
        };
        yield say(text);
      });
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, { onScopedStateChange: told });
      await session.start();
      await f.userSays('shared', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
      await f.userSays('own', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
      expect(told.mock.calls).toEqual([
        [
          {
            tenantId: f.ref.tenantId,
            appName: 'app',
            userId: 'user-1',
            app: false,
            user: true,
            origin: f.ref.conversationId,
          },
        ],
      ]);
      await session.close();
    });

    it('keeps its copy when reading it again fails, says so, and reads at the next step; the turn goes on', async () => {
      const f = await fixture();
      const other = await sibling(f);
      const reported: string[] = [];
      f.reportError = (message) => reported.push(message);
      const read = vi
        .spyOn(f.store, 'getScopedState')
        .mockRejectedValueOnce(new Error('connection terminated'));
      const session = await f.newSession(colorTeller());
      await session.start();
      await other.stores({ 'user:color': 'teal' });
      session.scopedStateChanged(other.change);
      await f.userSays('one', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(1));
      await f.userSays('two', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
      expect(f.answers().map(([text]) => text)).toEqual(['color: undefined', 'color: teal']);
      expect(read).toHaveBeenCalledTimes(2);
      expect(reported).toEqual(['could not read the user: and app: state again']);
      expect(f.states().map(([state]) => state)).not.toContain('error');
      await session.close();
    });
  });

  it('picks up a message without a wake-up on the next catch-up poll', async () => {
    const f = await fixture();
    const session = await f.newSession(echoTestAgent());
    await session.start();
    await f.userSays('quiet'); // no wake
    await Promise.resolve();
    f.clock.advance(CATCH_UP_MS);
    await vi.waitFor(() => expect(f.answers()).toEqual([['echo: quiet', 2]]));
    await session.close();
  });

  describe('change_agent_state', () => {
    it('pauses, holds messages while paused, and answers them on resume', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.start();
      const pauseId = await f.userRequests('paused', session);
      await vi.waitFor(() => expect(session.agentState).toBe('paused'));
      const heldId = await f.userSays('while paused', session);
      f.clock.advance(CATCH_UP_MS);
      await new Promise((resolve) => setImmediate(resolve));
      expect(f.answers()).toEqual([]);

      const resumeId = await f.userRequests('running', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: while paused', heldId]]));
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_input'));
      expect(f.states().slice(2)).toEqual([
        ['paused', pauseId, undefined],
        ['awaiting_user_input', resumeId, undefined],
        ['running', heldId, undefined],
        ['awaiting_user_input', heldId, undefined],
      ]);
      await session.close();
    });

    it('a pause mid-turn cuts the turn (it ends, not answered again); resuming answers what came meanwhile', async () => {
      const f = await fixture();
      const agent = new GatedAgent();
      const session = await f.newSession(agent);
      await session.start();
      const messageId = await f.userSays('slow', session);
      await agent.entered;
      expect(session.isMidTurn).toBe(true);

      const pauseId = await f.userRequests('paused', session);
      await vi.waitFor(() => expect(session.agentState).toBe('paused'));
      expect(agent.signals[0]?.aborted).toBe(true);
      expect(session.isMidTurn).toBe(false);
      expect(f.answers()).toEqual([]);

      // The cut turn is over: its message settled as interrupted.
      expect(
        f
          .states()
          .filter(([, cause]) => cause === messageId)
          .at(-1),
      ).toEqual(['awaiting_user_input', messageId, 'interrupted']);
      const queued = await f.userSays('meanwhile', session);
      agent.reset();
      agent.release();
      await f.userRequests('running', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: meanwhile', queued]]));
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_input'));
      expect(f.states().filter(([, cause]) => cause === pauseId)).toEqual([
        ['paused', pauseId, undefined],
      ]);
      await session.close();
    });

    it('stops on request: aborts the turn, stores stopped with the request as cause, and closes', async () => {
      const f = await fixture();
      const agent = new GatedAgent();
      const session = await f.newSession(agent);
      await session.start();
      await f.userSays('slow', session);
      await agent.entered;

      const stopId = await f.userRequests('stopped', session);
      await expect(session.closed).resolves.toBe('stopped');
      expect(agent.signals[0]?.aborted).toBe(true);
      expect(f.states().at(-1)).toEqual(['stopped', stopId, undefined]);
      expect(session.isClosed).toBe(true);

      const before = f.events().length;
      agent.release();
      await f.userSays('after stop', session);
      f.clock.advance(CATCH_UP_MS * 3);
      await new Promise((resolve) => setImmediate(resolve));
      expect(f.events()).toHaveLength(before + 1); // only the user's event
    });

    it('restores a paused conversation as paused', async () => {
      const f = await fixture();
      const first = await f.newSession(echoTestAgent());
      await first.start();
      await f.userRequests('paused', first);
      await vi.waitFor(() => expect(first.agentState).toBe('paused'));
      await first.close();
      // A holder that died while starting left only a `loading` behind.
      await f.store.append(f.ref.tenantId, f.ref.conversationId, [
        agentStateChangeDraft('loading'),
      ]);

      const queued = await f.userSays('queued');
      const second = await f.newSession(echoTestAgent());
      await second.start();
      expect(second.agentState).toBe('paused');
      expect(f.states().at(-1)?.[0]).toBe('paused');
      f.clock.advance(CATCH_UP_MS);
      await new Promise((resolve) => setImmediate(resolve));
      expect(f.answers()).toEqual([]);

      await f.userRequests('running', second);
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: queued', queued]]));
      await second.close();
    });
  });

  describe("the agent's signal", () => {
    it.each(['enqueue', 'reject'] as const)(
      'is never aborted for turns that end with their answer (%s, a message sent during the turn)',
      async (multitaskStrategy) => {
        const f = await fixture();
        const agent = new GatedAgent();
        const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, { multitaskStrategy });
        await session.start();
        const first = await f.userSays('first', session);
        await agent.entered;
        // Under `reject` the gateway refuses a message during the turn; the session only wakes.
        const second = multitaskStrategy === 'enqueue' ? await f.userSays('second', session) : null;
        if (second === null) session.wake();
        agent.release();
        const expected: [string, number][] = [['echo: first', first]];
        if (second !== null) expected.push(['echo: second', second]);
        await vi.waitFor(() => expect(f.answers()).toEqual(expected));
        await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_input'));
        expect(agent.signals).toHaveLength(expected.length);
        expect(agent.signals.map((signal) => signal.aborted)).toEqual(expected.map(() => false));
        await session.close();
      },
    );

    it('is aborted by an interrupt: a newer message cuts the running turn', async () => {
      const f = await fixture();
      const agent = new GatedAgent();
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, {
        multitaskStrategy: 'interrupt',
      });
      await session.start();
      await f.userSays('first', session);
      await agent.entered;
      await f.userSays('second', session);
      await vi.waitFor(() => expect(agent.signals[0]?.aborted).toBe(true));
      agent.release();
      await session.close();
    });
  });

  describe('stop() and close()', () => {
    it.each(['stop', 'close'] as const)(
      'a %s() between taking a message and beginning its turn cuts that turn before its agent runs',
      async (how) => {
        const f = await fixture();
        const agent = new GatedAgent();
        const session = await f.newSession(agent);
        await session.start();
        // The turn reads the settings again first (a PATCH changed them): held there.
        session.settingsChanged();
        let reached = () => {};
        const reading = new Promise<void>((resolve) => (reached = resolve));
        let release = () => {};
        const released = new Promise<void>((resolve) => (release = resolve));
        const read = f.store.getConversation.bind(f.store);
        vi.spyOn(f.store, 'getConversation').mockImplementationOnce(async (...args) => {
          reached();
          await released;
          return read(...args);
        });
        const messageId = await f.userSays('slow', session);
        await reading;

        const ending = how === 'stop' ? session.stop() : session.close();
        release();
        const first = await Promise.race([
          ending.then(() => 'ended'),
          agent.entered.then(() => 'the agent ran'),
        ]);
        agent.release();
        expect(first).toBe('ended');
        expect(agent.signals).toEqual([]);
        expect(await session.closed).toBe(how === 'stop' ? 'stopped' : 'closed');
        expect(f.answers()).toEqual([]);
        if (how === 'stop') {
          // Ended as a stop ends a running turn: interrupted, then stopped.
          expect(f.states().slice(-2)).toEqual([
            ['awaiting_user_input', messageId, 'interrupted'],
            ['stopped', null, undefined],
          ]);
        } else {
          // Nothing written: the message is the next holder's, as a close leaves a running turn.
          expect(f.states()).toEqual([
            ['loading', null, undefined],
            ['awaiting_user_input', null, undefined],
          ]);
        }
      },
    );

    it('stop(reason, notice) publishes the notice, stores stopped with the reason and closes', async () => {
      const f = await fixture();
      const agent = new GatedAgent();
      const session = await f.newSession(agent);
      await session.start();
      await f.userSays('slow', session);
      await agent.entered;

      const notice: StatusUpdate = {
        status_update: true,
        type: 'error',
        id: 'SOME$NOTICE',
        message: 'bye',
      };
      await session.stop('some_reason', notice);
      expect(await session.closed).toBe('stopped');
      expect(agent.signals[0]?.aborted).toBe(true);
      expect(f.states().at(-1)).toEqual(['stopped', null, 'some_reason']);
      expect(f.broadcaster.statusesOf(f.ref.conversationId)).toEqual([notice]);
      expect(f.answers()).toEqual([]);
    });

    it('close() aborts the turn and writes nothing', async () => {
      const f = await fixture();
      const agent = new GatedAgent();
      const session = await f.newSession(agent);
      await session.start();
      await f.userSays('slow', session);
      await agent.entered;
      const before = f.events().length;

      await session.close();
      agent.release();
      await new Promise((resolve) => setImmediate(resolve));
      expect(await session.closed).toBe('closed');
      expect(agent.signals[0]?.aborted).toBe(true);
      expect(f.events()).toHaveLength(before);
    });

    it('start() after close() rejects and writes nothing', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.close();
      await expect(session.start()).rejects.toBeInstanceOf(SessionClosedError);
      expect(f.events()).toEqual([]);
    });
  });

  it('ends a turn that takes more than maxIterations steps in error (max_iterations) and stays alive', async () => {
    const f = await fixture();
    let steps = 0;
    const agent = new ScriptedAgent(async function* (turn) {
      await Promise.resolve();
      if (messageText(turn.trigger) !== 'loop') {
        yield say('ok');
        return;
      }
      steps += 1;
      // Every step asks for a tool: the turn would never end by itself.
      yield { type: 'tool_call', tool: 'current_time', arguments: {} };
    });
    const session = await f.newSession(agent, 3);
    await session.start();
    const loopId = await f.userSays('loop', session);
    await vi.waitFor(() => expect(session.agentState).toBe('error'));

    expect(f.states().at(-1)).toEqual(['error', loopId, 'max_iterations']);
    expect(steps).toBe(3);
    const results = f.events().filter((e) => 'observation' in e && e.observation === 'tool_result');
    expect(results).toHaveLength(3);
    // Ids the runtime made (the agent gave none): distinct, and what providers take back.
    const ids = f
      .events()
      .flatMap((e) => ('action' in e && e.action === 'tool_call' ? [e.args['tool_call_id']] : []));
    expect(new Set(ids).size).toBe(3);
    for (const id of ids) expect(id).toMatch(/^call_[0-9a-f]{24}$/);

    const nextId = await f.userSays('next', session);
    await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['ok', nextId]));
    await session.close();
  });

  describe('the budget of a turn resumed by a new holder', () => {
    /** Every step costs 0.3 and asks for the time: only a limit ends its turn. */
    const spender = () =>
      new ScriptedAgent(async function* () {
        await Promise.resolve();
        yield { type: 'usage', prompt_tokens: 10, completion_tokens: 1, cost_usd: 0.3 };
        yield { type: 'tool_call', tool: 'current_time', arguments: {} };
      });

    const isResult = (drafts: readonly EventDraft[]) =>
      drafts.some((d) => 'observation' in d.body && d.body.observation === 'tool_result');

    /**
     * A first holder runs `steps` steps of a turn under `budget`, then hangs
     * storing the last one's tool result; a second holder takes over (its
     * `failedResult`th tool result fails to store once, when given).
     */
    async function resumedAfter(steps: number, budget: number, failedResult?: number) {
      const f = await fixture();
      let results = 0;
      let release!: () => void;
      const hung = new Promise<void>((resolve) => (release = resolve));
      f.store.beforeAppend = async (_id, drafts) => {
        if (isResult(drafts) && ++results === steps) await hung;
      };
      const firstAgent = spender();
      const first = await f.newSession(firstAgent, 10, CATCH_UP_MS, budget);
      await first.start();
      const ask = await f.userSays('spend', first);
      await vi.waitFor(() => expect(results).toBe(steps));
      expect(firstAgent.turns).toHaveLength(steps);

      let secondResults = 0;
      f.store.beforeAppend = (_id, drafts) => {
        if (isResult(drafts) && ++secondResults === failedResult)
          throw new Error('connection reset');
      };
      const secondAgent = spender();
      const second = await f.newSession(secondAgent, 10, CATCH_UP_MS, budget);
      await second.start();
      if (failedResult !== undefined) {
        await vi.waitFor(() => expect(second.lastError).toBeInstanceOf(Error));
        f.clock.advance(CATCH_UP_MS);
      }
      await vi.waitFor(() =>
        expect(f.states().at(-1)).toEqual(['error', ask, 'max_budget_exceeded']),
      );
      release();
      await expect(first.closed).resolves.toBe('lease_lost');
      await second.close();
      const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
      return { ask, record, secondSteps: secondAgent.turns.length };
    }

    it('ends a turn whose stored cost is past the budget in max_budget_exceeded, without asking the agent again', async () => {
      const { ask, record, secondSteps } = await resumedAfter(2, 0.5);
      expect(secondSteps).toBe(0);
      expect(record?.turnCost).toEqual({ cause: ask, costUsd: expect.closeTo(0.6, 10) });
      expect(record?.metrics.cost_usd).toBeCloseTo(0.6, 10);
    });

    it('goes on with a turn under the budget, counting what its earlier steps cost', async () => {
      const { ask, record, secondSteps } = await resumedAfter(3, 1);
      // 0.9 stored: one more step (1.2) passes the budget.
      expect(secondSteps).toBe(1);
      expect(record?.turnCost).toEqual({ cause: ask, costUsd: expect.closeTo(1.2, 10) });
      expect(record?.metrics).toMatchObject({ iterations: 4, cost_usd: expect.closeTo(1.2, 10) });
    });

    it('ends the turn once its cost reaches the budget: no step starts that could only pass it', async () => {
      const f = await fixture();
      const agent = spender();
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0.6);
      await session.start();
      const ask = await f.userSays('spend', session);
      await vi.waitFor(() =>
        expect(f.states().at(-1)).toEqual(['error', ask, 'max_budget_exceeded']),
      );
      expect(agent.turns).toHaveLength(2);
      // The step that reached it does not get its call run: its result says so.
      const results = f
        .events()
        .flatMap((e) => (isObservation(e) && e.observation === 'tool_result' ? [e] : []));
      expect(results.map((e) => [e.content, e.extras])).toEqual([
        [expect.stringMatching(/^20\d\d-/), expect.objectContaining({ is_error: false })],
        [
          'The turn reached its budget before this call ran: it never ran.',
          expect.objectContaining({ is_error: true }),
        ],
      ]);
      await session.close();
    });

    it('counts what an attempt that failed to store its tool result stored, when it runs the turn again', async () => {
      // 0.6 stored; the second holder stores a step (0.9), then fails storing its result.
      const { record, secondSteps } = await resumedAfter(2, 1, 2);
      // Its second attempt runs the stored call, then one more step (1.2).
      expect(secondSteps).toBe(2);
      expect(record?.metrics).toMatchObject({ iterations: 4, cost_usd: expect.closeTo(1.2, 10) });
    });
  });

  it('cuts off an agent that never ends its step, and stays alive', async () => {
    const f = await fixture();
    const agent = new ScriptedAgent(async function* (turn) {
      if (messageText(turn.trigger) !== 'spin') {
        yield say('ok');
        return;
      }
      for (;;) yield { type: 'delta', delta: 'x'.repeat(64) };
    });
    const session = await f.newSession(agent);
    await session.start();
    const spinId = await f.userSays('spin', session);
    await vi.waitFor(() => expect(session.agentState).toBe('error'), { timeout: 10_000 });
    expect(f.states().at(-1)).toEqual(['error', spinId, 'agent_error']);
    const nextId = await f.userSays('next', session);
    await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['ok', nextId]));
    await session.close();
  });

  it('stores error with a safe message when the agent throws, reports the detail, and answers the next message', async () => {
    const f = await fixture();
    const reported: unknown[] = [];
    f.reportError = (_message, error) => reported.push(error);
    const agent = new ScriptedAgent(async function* (turn) {
      await Promise.resolve();
      if (messageText(turn.trigger) === 'boom')
        throw new Error('model exploded\n    at secret.ts:1:1');
      yield say('fine');
    });
    const session = await f.newSession(agent);
    await session.start();
    const boomId = await f.userSays('boom', session);
    await vi.waitFor(() => expect(session.agentState).toBe('error'));

    const failure = f.events().at(-1)!;
    expect(readAgentStateChange(failure)).toEqual({ agentState: 'error', reason: 'agent_error' });
    expect(failure.cause).toBe(boomId);
    // The exception's text (a backend's host names, a stack) reaches the logs, not the users.
    expect(JSON.stringify(failure)).not.toContain('model exploded');
    expect(JSON.stringify(failure)).not.toContain('secret.ts');
    expect(failure).toMatchObject({ message: AGENT_FAILED_MESSAGE });
    expect(reported).toEqual([
      expect.objectContaining({ message: expect.stringContaining('model exploded') }),
    ]);
    expect(f.broadcaster.statusesOf(f.ref.conversationId).map((s) => s.id)).toEqual([
      'AGENT_ERROR$ERROR',
    ]);

    const nextId = await f.userSays('again', session);
    await vi.waitFor(() => expect(f.answers()).toEqual([['fine', nextId]]));
    await session.close();
  });

  it('ends a turn whose output the store refuses in error once, and answers the next message', async () => {
    const f = await fixture();
    let runs = 0;
    const agent = new ScriptedAgent(async function* (turn) {
      await Promise.resolve();
      runs += 1;
      // Deltas are checked only when their text is stored (a pair may be split across two).
      if (messageText(turn.trigger) === 'poison') yield { type: 'delta', delta: 'bad \u0000 text' };
      else yield say('fine');
    });
    // What Postgres does with a NUL: the store refuses the write for what it holds.
    f.store.beforeAppend = (_id, drafts) => {
      if (JSON.stringify(drafts).includes('\\u0000')) {
        throw new BadRequestError('text contains characters that cannot be stored');
      }
    };
    const session = await f.newSession(agent);
    await session.start();
    const poisonId = await f.userSays('poison', session);
    const nextId = await f.userSays('next', session);
    await vi.waitFor(() => expect(f.answers()).toEqual([['fine', nextId]]));
    expect(runs).toBe(2);
    const settled = f.events().filter((e) => e.cause === poisonId && readAgentStateChange(e));
    expect(settled.map((e) => readAgentStateChange(e)?.agentState)).toEqual(['error']);
    expect(settled[0]).toMatchObject({ message: OUTPUT_REFUSED_MESSAGE });
    await session.close();
  });

  it('runs the agent at most three times for a message whose answer keeps failing to store', async () => {
    const f = await fixture();
    let runs = 0;
    const agent = new ScriptedAgent(async function* () {
      await Promise.resolve();
      runs += 1;
      yield say('never stored');
    });
    f.store.beforeAppend = (_id, drafts) => {
      if (hasAgentEvent(drafts)) throw new Error('connection reset');
    };
    const session = await f.newSession(agent);
    await session.start();
    const messageId = await f.userSays('hello', session);
    await vi.waitFor(
      () => {
        f.clock.advance(CATCH_UP_MS);
        expect(session.agentState).toBe('error');
      },
      { timeout: 5_000, interval: 50 },
    );
    expect(runs).toBe(3);
    const failure = f.events().at(-1)!;
    expect(failure).toMatchObject({ cause: messageId, message: STORE_FAILED_MESSAGE });
    await session.close();
  });

  describe('human approval', () => {
    /** Calls current_time once, then answers with what the result said. */
    const caller = () =>
      new ScriptedAgent(async function* (turn) {
        const recent = await turn.history.recent(20);
        const result = recent.find(
          (e) => 'observation' in e && e.observation === 'tool_result' && e.id > turn.trigger.id,
        );
        if (!result || !('extras' in result)) {
          yield { type: 'tool_call', tool: 'current_time', arguments: {} };
          return;
        }
        yield say(result.extras['rejected'] ? 'rejected' : `time ${result.content}`);
      });

    async function confirmationFixture() {
      const f = await fixture();
      await f.store.updateConversation(f.ref.tenantId, f.ref.conversationId, {
        confirmationMode: true,
      });
      return f;
    }

    it('stores the calls, waits for the user, and runs them once confirmed', async () => {
      const f = await confirmationFixture();
      const session = await f.newSession(caller());
      await session.start();
      const ask = await f.userSays('time?', session);
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_confirmation'));
      expect(f.events().some((e) => 'observation' in e && e.observation === 'tool_result')).toBe(
        false,
      );
      const confirm = await f.userRequests('user_confirmed', session);
      await vi.waitFor(() => expect(f.answers().at(-1)?.[1]).toBe(ask));
      expect(f.answers().at(-1)?.[0]).toMatch(/^time \d{4}-/);
      expect(
        f.states().some(([state, cause]) => state === 'user_confirmed' && cause === confirm),
      ).toBe(true);
      await session.close();
    });

    it('tells the agent of a rejection, and a message meanwhile rejects the calls and is answered next', async () => {
      const f = await confirmationFixture();
      const session = await f.newSession(caller());
      await session.start();
      const first = await f.userSays('time?', session);
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_confirmation'));
      await f.userRequests('user_rejected', session);
      await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['rejected', first]));

      const second = await f.userSays('time again?', session);
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_confirmation'));
      const third = await f.userSays('never mind', session);
      // The third message is a turn of its own (its agent sees the rejected call before it).
      await vi.waitFor(() => expect(f.answers().at(-1)?.[1]).toBe(third));
      const rejected = f
        .events()
        .filter(
          (e) => 'observation' in e && e.observation === 'tool_result' && e.extras['is_error'],
        );
      expect(rejected).toHaveLength(2);
      // Both rejections say so: the user's, and the one of the message sent meanwhile.
      for (const result of rejected) expect(result).toMatchObject({ extras: { rejected: true } });
      expect(
        f
          .states()
          .filter(([, cause]) => cause === second)
          .at(-1)?.[0],
      ).toBe('awaiting_user_input');
      await session.close();
    });

    it('a pending approval survives a new holder, which waits without asking the agent again', async () => {
      const f = await confirmationFixture();
      const agent = caller();
      const first = await f.newSession(agent);
      await first.start();
      const ask = await f.userSays('time?', first);
      await vi.waitFor(() => expect(first.agentState).toBe('awaiting_user_confirmation'));
      await first.close();
      const steps = agent.turns.length;

      const statesBefore = f.states().length;
      const second = await f.newSession(agent);
      await second.start();
      await vi.waitFor(() => expect(second.agentState).toBe('awaiting_user_confirmation'));
      expect(agent.turns.length).toBe(steps);
      // Never "awaiting input" in between: a client would hide the approval meanwhile.
      expect(
        f
          .states()
          .slice(statesBefore)
          .map(([state]) => state),
      ).toEqual(['loading', 'awaiting_user_confirmation']);
      await f.userRequests('user_confirmed', second);
      await vi.waitFor(() => expect(f.answers().at(-1)?.[1]).toBe(ask));
      expect(
        f.events().filter((e) => 'observation' in e && e.observation === 'tool_result'),
      ).toHaveLength(1);
      await second.close();
    });
    describe('a tool not declared idempotent', () => {
      /** `charge`, not idempotent, counting its runs; an agent that calls it, then answers. */
      function charging() {
        const runs: string[] = [];
        const tools = new ToolRegistry(30_000);
        tools.add('charge', {
          description: 'charges a card',
          parameters: { type: 'object' },
          idempotent: false,
          run: (_args, { idempotency_key }) => {
            runs.push(idempotency_key);
            return 'charged';
          },
        });
        const agent = new ScriptedAgent(async function* (turn) {
          const recent = await turn.history.recent(20);
          const result = recent.find(
            (e) => isObservation(e) && e.observation === 'tool_result' && e.id > turn.trigger.id,
          );
          if (!result || !isObservation(result)) {
            yield { type: 'tool_call', tool: 'charge', arguments: {} };
            return;
          }
          yield say(`result: ${result.content}`);
        });
        return { runs, agent, options: { tools } };
      }

      it('gets a key of its own for each call, though the agent repeats its tool_call_id', async () => {
        const f = await fixture();
        const charge = charging();
        const agent = new ScriptedAgent(async function* (turn) {
          const recent = await turn.history.recent(20);
          const answered = recent.some(
            (e) => isObservation(e) && e.observation === 'tool_result' && e.id > turn.trigger.id,
          );
          if (!answered) {
            yield { type: 'tool_call', tool: 'charge', arguments: {}, tool_call_id: 'call_0' };
            return;
          }
          yield say('charged');
        });
        const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, charge.options);
        await session.start();
        for (const text of ['pay', 'pay again']) {
          const ask = await f.userSays(text, session);
          await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['charged', ask]));
        }
        expect(charge.runs).toHaveLength(2);
        expect(new Set(charge.runs).size).toBe(2);
        await session.close();
      });

      it('runs once confirmed, also for a message stored before the session started', async () => {
        const f = await confirmationFixture();
        const charge = charging();
        // Stored while nobody held the conversation: the message that starts it.
        const ask = await f.userSays('pay');
        const session = await f.newSession(charge.agent, 10, CATCH_UP_MS, 0, charge.options);
        await session.start();
        await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_confirmation'));
        expect(charge.runs).toEqual([]);
        await f.userRequests('user_confirmed', session);
        await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['result: charged', ask]));
        expect(charge.runs).toHaveLength(1);
        await session.close();
      });

      /** A first holder stores the call and closes while it awaits confirmation. */
      async function pendingOnClose() {
        const f = await confirmationFixture();
        const charge = charging();
        const first = await f.newSession(charge.agent, 10, CATCH_UP_MS, 0, charge.options);
        await first.start();
        const ask = await f.userSays('pay', first);
        await vi.waitFor(() => expect(first.agentState).toBe('awaiting_user_confirmation'));
        await first.close();
        const next = () => f.newSession(charge.agent, 10, CATCH_UP_MS, 0, charge.options);
        return { f, charge, ask, next };
      }

      it('runs once confirmed on a new holder: a call that awaited a confirmation never started', async () => {
        const { f, charge, ask, next } = await pendingOnClose();
        const second = await next();
        await second.start();
        await vi.waitFor(() => expect(second.agentState).toBe('awaiting_user_confirmation'));
        await f.userRequests('user_confirmed', second);
        await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['result: charged', ask]));
        expect(charge.runs).toHaveLength(1);
        await second.close();
      });

      it('is in doubt on a new holder when the confirmation was applied before the failover', async () => {
        const { f, charge, ask, next } = await pendingOnClose();
        // The holder applied the confirmation (its state change is stored), then died: the
        // call may have run.
        const confirm = await f.userRequests('user_confirmed');
        await f.store.append(f.ref.tenantId, f.ref.conversationId, [
          agentStateChangeDraft('user_confirmed', { cause: confirm }),
        ]);
        const second = await next();
        await second.start();
        await vi.waitFor(() => expect(f.answers().at(-1)?.[1]).toBe(ask));
        expect(charge.runs).toEqual([]);
        const result = f.events().find((e) => isObservation(e) && e.observation === 'tool_result');
        expect(result).toMatchObject({ extras: { is_error: true, in_doubt: true } });
        await second.close();
      });
    });
  });

  it('runs no tool outside agent_config.tools, even when the agent calls one: it is answered as unknown', async () => {
    const f = await fixture('test', { tools: ['current_time'] });
    const offered: string[][] = [];
    const agent = new ScriptedAgent(async function* (turn) {
      offered.push(turn.tools.map((t) => t.name));
      const recent = await turn.history.recent(20);
      if (!recent.some((e) => isObservation(e) && e.observation === 'tool_result')) {
        yield { type: 'tool_call', tool: 'set_state', arguments: { key: 'user:x', value: 1 } };
        yield { type: 'tool_call', tool: 'current_time', arguments: {} };
        return;
      }
      yield say('done');
    });
    const session = await f.newSession(agent);
    await session.start();
    const ask = await f.userSays('go', session);
    await vi.waitFor(() => expect(f.answers().at(-1)).toEqual(['done', ask]));
    expect(offered[0]).toEqual(['current_time']);
    const results = f.events().filter((e) => isObservation(e) && e.observation === 'tool_result');
    expect(results).toMatchObject([
      { content: 'unknown tool: set_state', extras: { tool: 'set_state', is_error: true } },
      { extras: { tool: 'current_time', is_error: false } },
    ]);
    expect(session.sessionState).toEqual({});
    await session.close();
  });

  describe('a turn ended while its tool calls have no result', () => {
    /**
     * The built-ins and `slow`, whose first run waits until its signal aborts
     * (later runs answer at once), with the tool calls the metrics counted.
     */
    function slowTools(idempotent: boolean) {
      const runs: string[] = [];
      const counted: [string, string][] = [];
      const tools = new ToolRegistry(30_000);
      for (const [name, tool] of Object.entries(BUILTIN_TOOLS)) tools.add(name, tool);
      tools.add('slow', {
        description: 'waits for a cut the first time',
        parameters: { type: 'object' },
        idempotent,
        run: (_args, { signal, idempotency_key }) => {
          runs.push(idempotency_key);
          if (runs.length > 1) return 'done';
          return new Promise((_resolve, reject) => {
            signal.addEventListener('abort', () => reject(new Error('aborted')), { once: true });
          });
        },
      });
      const metrics: RuntimeMetrics = {
        stepFinished: () => undefined,
        tokensUsed: () => undefined,
        toolCalled: (tool, outcome) => counted.push([tool, outcome]),
      };
      return { runs, counted, options: { tools, metrics } };
    }

    /** A step of two calls (`slow`, then `current_time`), then an answer counting the results. */
    const twoCalls = () =>
      new ScriptedAgent(async function* (turn) {
        const recent = await turn.history.recent(50);
        const results = recent.filter(
          (e) => isObservation(e) && e.observation === 'tool_result' && e.id > turn.trigger.id,
        );
        if (results.length === 0) {
          yield { type: 'tool_call', tool: 'slow', arguments: {} };
          yield { type: 'tool_call', tool: 'current_time', arguments: {} };
          return;
        }
        yield say(`${results.length} results`);
      });

    type Fixture = Awaited<ReturnType<typeof fixture>>;
    const isCall = (e: StoredEvent) => isAction(e) && e.action === 'tool_call';
    const isResult = (e: StoredEvent) => isObservation(e) && e.observation === 'tool_result';

    /** The turn's calls, and what the session stored after the last: results, what settled it. */
    function afterCalls(f: Fixture, messageId: number) {
      const events = f.events();
      const calls = events.filter((e) => isCall(e) && e.cause === messageId);
      const last = events.indexOf(calls.at(-1)!);
      return { calls, after: events.slice(last + 1).filter((e) => e.source !== 'user') };
    }

    /** Each stored call has one is_error result linked by cause, stored with the settling change. */
    function expectAnswered(f: Fixture, messageId: number, why: string) {
      const { calls, after } = afterCalls(f, messageId);
      expect(calls.map((c) => (isAction(c) ? c.args['tool'] : null))).toEqual([
        'slow',
        'current_time',
      ]);
      const [cut, notRun, settle] = after;
      expect(cut).toMatchObject({
        source: 'environment',
        observation: 'tool_result',
        cause: calls[0]!.id,
        extras: { tool: 'slow', is_error: true },
      });
      expect(isObservation(cut!) && cut.content).toBe(
        `${why} while this call ran: it did not finish, and its effect may or may not have happened.`,
      );
      expect(notRun).toMatchObject({
        observation: 'tool_result',
        cause: calls[1]!.id,
        extras: { tool: 'current_time', is_error: true },
      });
      expect(isObservation(notRun!) && notRun.content).toBe(
        `${why} before this call ran: it never ran.`,
      );
      expect(readAgentStateChange(settle!)).toMatchObject({
        agentState: 'awaiting_user_input',
        reason: 'interrupted',
      });
      expect(settle?.cause).toBe(messageId);
    }

    /** The bodies of each append, as `observation` or `action` names, from now on. */
    function appendsOf(f: Fixture): string[][] {
      const appends: string[][] = [];
      f.store.afterAppend = (_id, drafts) => {
        appends.push(
          drafts.map((d) => ('observation' in d.body ? d.body.observation : d.body.action)),
        );
      };
      return appends;
    }

    it('a stop (change_agent_state) during a running call answers it and the call that never started, before the settling change, in one write', async () => {
      const f = await fixture();
      const slow = slowTools(false);
      const session = await f.newSession(twoCalls(), 10, CATCH_UP_MS, 0, slow.options);
      await session.start();
      const appends = appendsOf(f);
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(slow.runs).toHaveLength(1));

      const stopId = await f.userRequests('stopped', session);
      await expect(session.closed).resolves.toBe('stopped');
      expectAnswered(f, ask, 'The conversation was stopped');
      expect(f.states().at(-1)).toEqual(['stopped', stopId, undefined]);
      // The results and the settling change in one write, then `stopped`.
      expect(appends.slice(-2)).toEqual([
        ['tool_result', 'tool_result', 'agent_state_changed'],
        ['agent_state_changed'],
      ]);
      expect(slow.counted).toEqual([
        ['slow', 'cancelled'],
        ['current_time', 'not_run'],
      ]);
    });

    it('a stop() (POST …/stop) during a running call answers the calls; the next holder answers the next message', async () => {
      const f = await fixture();
      const slow = slowTools(false);
      const agent = twoCalls();
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
      await session.start();
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(slow.runs).toHaveLength(1));

      await session.stop();
      expectAnswered(f, ask, 'The conversation was stopped');
      expect(f.states().at(-1)?.[0]).toBe('stopped');
      expect(slow.counted).toEqual([
        ['slow', 'cancelled'],
        ['current_time', 'not_run'],
      ]);

      const next = await f.userSays('again');
      const second = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
      await second.start();
      await vi.waitFor(() => expect(f.answers()).toEqual([['2 results', next]]));
      expect(slow.runs).toHaveLength(2); // the cut call is not run again
      await second.close();
    });

    it('counts a call to a tool no one has under the label unknown (agents may name anything)', async () => {
      const f = await fixture();
      const slow = slowTools(true);
      const agent = new ScriptedAgent(async function* (turn) {
        const recent = await turn.history.recent(10);
        if (!recent.some((e) => isObservation(e) && e.observation === 'tool_result')) {
          yield { type: 'tool_call', tool: 'made_up_by_the_model_1234', arguments: {} };
          return;
        }
        yield say('done');
      });
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
      await session.start();
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['done', ask]]));
      expect(slow.counted).toEqual([['unknown', 'error']]);
      await session.close();
    });

    it('a newer message under interrupt answers the calls, then is answered', async () => {
      const f = await fixture();
      const slow = slowTools(true);
      const session = await f.newSession(twoCalls(), 10, CATCH_UP_MS, 0, {
        ...slow.options,
        multitaskStrategy: 'interrupt',
      });
      await session.start();
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(slow.runs).toHaveLength(1));

      const next = await f.userSays('something else', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['2 results', next]]));
      expectAnswered(f, ask, 'A new message interrupted the turn');
      expect(slow.counted.slice(0, 2)).toEqual([
        ['slow', 'cancelled'],
        ['current_time', 'not_run'],
      ]);
      await session.close();
    });

    it('under interrupt, of two messages that came together during a turn the newer cuts the older one too', async () => {
      const f = await fixture();
      const started: string[] = [];
      // Waits for its cut, but answers "last" at once.
      const agent = new ScriptedAgent(async function* (turn) {
        const text = messageText(turn.trigger);
        started.push(text);
        if (text !== 'last') {
          await new Promise((resolve) => turn.signal.addEventListener('abort', resolve));
          return;
        }
        yield say('answered last');
      });
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, {
        multitaskStrategy: 'interrupt',
      });
      await session.start();
      const first = await f.userSays('first', session);
      await vi.waitFor(() => expect(started).toEqual(['first']));
      const [second, last] = await f.store.append(
        f.ref.tenantId,
        f.ref.conversationId,
        ['second', 'last'].map((text) => ({
          source: 'user' as const,
          body: { action: 'message', args: { content: text }, message: text },
        })),
      );
      session.wake();
      await vi.waitFor(() => expect(f.answers()).toEqual([['answered last', last!.event.id]]));
      for (const cut of [first, second!.event.id]) {
        expect(
          f
            .states()
            .filter(([, cause]) => cause === cut)
            .at(-1),
        ).toEqual(['awaiting_user_input', cut, 'interrupted']);
      }
      await session.close();
    });

    it('a pause answers the calls; resuming answers what came meanwhile', async () => {
      const f = await fixture();
      const slow = slowTools(false);
      const session = await f.newSession(twoCalls(), 10, CATCH_UP_MS, 0, slow.options);
      await session.start();
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(slow.runs).toHaveLength(1));

      await f.userRequests('paused', session);
      await vi.waitFor(() => expect(session.agentState).toBe('paused'));
      expectAnswered(f, ask, 'The conversation was paused');
      const next = await f.userSays('meanwhile', session);
      await f.userRequests('running', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['2 results', next]]));
      await session.close();
    });

    it('a stop() while calls await confirmation answers them (they never ran); the next holder does not wait for an answer', async () => {
      const f = await fixture();
      await f.store.updateConversation(f.ref.tenantId, f.ref.conversationId, {
        confirmationMode: true,
      });
      const slow = slowTools(false);
      const agent = twoCalls();
      const session = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
      await session.start();
      const ask = await f.userSays('go', session);
      await vi.waitFor(() => expect(session.agentState).toBe('awaiting_user_confirmation'));

      await session.stop();
      const { calls, after } = afterCalls(f, ask);
      const results = after.filter(isResult);
      expect(results.map((r) => r.cause)).toEqual(calls.map((c) => c.id));
      for (const result of results) {
        expect(result).toMatchObject({ extras: { is_error: true } });
        // A stop is no rejection by the user.
        expect(result).not.toHaveProperty('extras.rejected');
        expect(isObservation(result) && result.content).toBe(
          'The conversation was stopped before this call was confirmed: it never ran.',
        );
      }
      expect(f.states().slice(-2)).toEqual([
        ['awaiting_user_input', ask, 'superseded'],
        ['stopped', null, undefined],
      ]);
      expect(slow.runs).toEqual([]);
      expect(slow.counted).toEqual([
        ['slow', 'not_run'],
        ['current_time', 'not_run'],
      ]);

      const steps = agent.turns.length;
      const second = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
      await second.start();
      expect(second.agentState).toBe('awaiting_user_input');
      f.clock.advance(CATCH_UP_MS);
      await new Promise((resolve) => setImmediate(resolve));
      expect(agent.turns.length).toBe(steps);
      await second.close();
    });

    describe('a new holder (failover), which nothing answered for', () => {
      async function cutByFailover(idempotent: boolean) {
        const f = await fixture();
        const slow = slowTools(idempotent);
        const agent = twoCalls();
        const first = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
        await first.start();
        const ask = await f.userSays('go', first);
        await vi.waitFor(() => expect(slow.runs).toHaveLength(1));
        await first.close();
        expect(f.events().filter(isResult)).toEqual([]);
        expect(slow.counted).toEqual([]);

        const second = await f.newSession(agent, 10, CATCH_UP_MS, 0, slow.options);
        await second.start();
        await vi.waitFor(() => expect(f.answers()).toEqual([['2 results', ask]]));
        await second.close();
        const { calls, after } = afterCalls(f, ask);
        const results = after.filter(isResult);
        expect(results.map((r) => r.cause)).toEqual(calls.map((c) => c.id));
        return { f, slow, results };
      }

      it('runs an idempotent call again, with the same key', async () => {
        const { f, slow, results } = await cutByFailover(true);
        expect(slow.runs).toHaveLength(2);
        // `<conversation_id>:<id of the stored call>`: the same on the new holder.
        expect(slow.runs[0]).toBe(`${f.ref.conversationId}:${results[0]!.cause}`);
        expect(slow.runs[1]).toBe(slow.runs[0]);
        expect(results[0]).toMatchObject({ content: 'done', extras: { is_error: false } });
        expect(slow.counted).toEqual([
          ['slow', 'ok'],
          ['current_time', 'ok'],
        ]);
      });

      it('stores in_doubt for a call not declared idempotent, and runs it no more', async () => {
        const { slow, results } = await cutByFailover(false);
        expect(slow.runs).toHaveLength(1);
        expect(results[0]).toMatchObject({ extras: { is_error: true, in_doubt: true } });
        expect(results[1]).toMatchObject({ extras: { is_error: false } });
        expect(slow.counted).toEqual([
          ['slow', 'in_doubt'],
          ['current_time', 'ok'],
        ]);
      });
    });
  });

  it('stops at once and writes nothing more when its lease is lost', async () => {
    const f = await fixture();
    const agent = new GatedAgent();
    const session = await f.newSession(agent);
    await session.start();
    await f.userSays('slow', session);
    await agent.entered;

    await f.store.acquireLease(f.ref.tenantId, f.ref.conversationId, 'someone-else');
    const before = f.events().length;
    agent.release();

    await expect(session.closed).resolves.toBe('lease_lost');
    expect(agent.signals[0]?.aborted).toBe(true);
    expect(session.isClosed).toBe(true);
    await f.userSays('later', session);
    f.clock.advance(CATCH_UP_MS * 3);
    await session.stop('too late');
    expect(f.events()).toHaveLength(before + 1); // only the user's event
    expect(f.answers()).toEqual([]);
  });

  it('tells onEnd once, after it ended, how it ended (stop, close, lease lost)', async () => {
    const f = await fixture();
    const ended: [string, string][] = [];
    const open = async () =>
      new AgentSession({
        store: f.store,
        broadcaster: f.broadcaster,
        ref: f.ref,
        leaseEpoch: await f.store.acquireLease(f.ref.tenantId, f.ref.conversationId, 'test-owner'),
        agent: echoTestAgent(),
        options: {
          maxIterations: 10,
          clock: f.clock,
          onEnd: (ref, reason) => ended.push([ref.conversationId, reason]),
        },
      });
    const stopped = await open();
    await stopped.start();
    await stopped.stop();
    await stopped.stop();
    const closed = await open();
    await closed.start();
    await closed.close();
    const fenced = await open();
    await fenced.start();
    await f.store.acquireLease(f.ref.tenantId, f.ref.conversationId, 'someone-else');
    await f.userSays('too late', fenced);
    await fenced.closed;
    await vi.waitFor(() => expect(ended).toHaveLength(3));
    const id = f.ref.conversationId;
    expect(ended).toEqual([
      [id, 'stopped'],
      [id, 'closed'],
      [id, 'lease_lost'],
    ]);
  });

  it("titles an untitled conversation after its first answer and counts the title request's usage", async () => {
    const f = await fixture('');
    const agent = echoTestAgent();
    const titled: Agent = {
      step: (context) => agent.step(context),
      title: async () => ({
        title: '  Greetings  ',
        usage: { prompt_tokens: 30, completion_tokens: 5 },
      }),
    };
    const session = new AgentSession({
      store: f.store,
      broadcaster: f.broadcaster,
      ref: f.ref,
      leaseEpoch: await f.store.acquireLease(f.ref.tenantId, f.ref.conversationId, 'test-owner'),
      agent: titled,
      options: {
        maxIterations: 10,
        clock: f.clock,
        price: (_model, usage) => usage.promptTokens / 1000,
      },
    });
    await session.start();
    await f.userSays('hello', session);
    await vi.waitFor(async () => {
      const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
      expect(record?.title).toBe('Greetings');
    });
    const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
    expect(record?.metrics).toMatchObject({
      prompt_tokens: 30,
      completion_tokens: 5,
      cost_usd: 0.03,
    });
    expect(f.broadcaster.statusesOf(f.ref.conversationId)).toContainEqual(
      expect.objectContaining({ id: 'STATUS$TITLE_UPDATED', message: 'Greetings' }),
    );
    await session.stop();
  });

  it("cleans a model title of what cannot be stored, falls back to the first message's rule when nothing is left, and reports it", async () => {
    for (const [made, expected] of [
      ['Gree\u0000tings \ud800', 'Greetings'],
      ['\u0000 \udc00', 'hello there'],
    ] as const) {
      const f = await fixture('');
      const agent = echoTestAgent();
      const reported: string[] = [];
      const titled: Agent = {
        step: (context) => agent.step(context),
        title: async () => ({ title: made }),
      };
      const session = new AgentSession({
        store: f.store,
        broadcaster: f.broadcaster,
        ref: f.ref,
        leaseEpoch: await f.store.acquireLease(f.ref.tenantId, f.ref.conversationId, 'test-owner'),
        agent: titled,
        options: {
          maxIterations: 10,
          clock: f.clock,
          reportError: (message) => reported.push(message),
        },
      });
      await session.start();
      await f.userSays('hello there', session);
      await vi.waitFor(async () => {
        const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
        expect(record?.title).toBe(expected);
      });
      expect(f.broadcaster.statusesOf(f.ref.conversationId)).toContainEqual(
        expect.objectContaining({ id: 'STATUS$TITLE_UPDATED', message: expected }),
      );
      expect(reported).toContainEqual(
        expect.stringContaining('title with characters that cannot be stored'),
      );
      await session.stop();
    }
  });

  it('keeps a title given (PATCH) after the session started, before its first answer', async () => {
    const f = await fixture('');
    const agent = echoTestAgent();
    const titled: Agent = {
      step: (context) => agent.step(context),
      title: async () => ({
        title: 'Model title',
        usage: { prompt_tokens: 7, completion_tokens: 1 },
      }),
    };
    const session = await f.newSession(titled);
    await session.start();
    await f.store.updateConversation(f.ref.tenantId, f.ref.conversationId, { title: 'Mine' });
    await f.userSays('hello there', session);
    // The title request is counted once its outcome is stored.
    await vi.waitFor(async () => {
      const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
      expect(record?.metrics.prompt_tokens).toBe(7);
    });
    const record = await f.store.getConversation(f.ref.tenantId, f.ref.conversationId);
    expect(record?.title).toBe('Mine');
    expect(f.broadcaster.statusesOf(f.ref.conversationId)).not.toContainEqual(
      expect.objectContaining({ id: 'STATUS$TITLE_UPDATED' }),
    );
    await session.stop();
  });

  describe('exactly-once answers', () => {
    it('a holder that died between running and the answer: the next holder answers once', async () => {
      const f = await fixture();
      const doomedAgent = new GatedAgent();
      const doomed = await f.newSession(doomedAgent);
      await doomed.start();
      const messageId = await f.userSays('important', doomed);
      await doomedAgent.entered;
      // A turn that lasts shows `running` on its own, before any answer.
      await vi.waitFor(() => expect(f.states().at(-1)).toEqual(['running', messageId, undefined]));

      // The holder is presumed dead; a new one takes the lease and restores.
      const successor = await f.newSession(echoTestAgent());
      await successor.start();
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: important', messageId]]));

      // The old holder wakes up and tries to answer: fenced off.
      doomedAgent.release();
      await expect(doomed.closed).resolves.toBe('lease_lost');
      expect(f.answers()).toEqual([['echo: important', messageId]]);
      await successor.close();

      // A completed turn is never answered again by a later holder.
      const third = await f.newSession(echoTestAgent());
      await third.start();
      f.clock.advance(CATCH_UP_MS * 2);
      await new Promise((resolve) => setImmediate(resolve));
      expect(f.answers()).toEqual([['echo: important', messageId]]);
      expect(
        f
          .states()
          .slice(-2)
          .map(([state]) => state),
      ).toEqual(['loading', 'awaiting_user_input']);
      await third.close();
    });

    it('stores a quick turn (running, answer, awaiting input) in one transaction', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.start();
      const batches: string[][] = [];
      f.store.beforeAppend = (_id, drafts) => {
        batches.push(
          drafts.map((d) =>
            'extras' in d.body
              ? String(d.body.extras['agent_state'])
              : `${d.source}:${'action' in d.body ? d.body.action : ''}`,
          ),
        );
      };
      const messageId = await f.userSays('quick', session);
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: quick', messageId]]));
      expect(batches).toContainEqual(['running', 'agent:message', 'awaiting_user_input']);
      expect(batches.filter((batch) => batch.includes('running'))).toHaveLength(1);
      await session.close();
    });

    it('a final batch that failed to store leaves the turn to be run again, answered once', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.start();
      // Fail the write that settles the turn: the answer must not survive without it.
      f.store.beforeAppend = failOnce(
        (drafts) =>
          drafts.some(
            (d) =>
              d.cause !== undefined &&
              'extras' in d.body &&
              d.body.extras['agent_state'] === 'awaiting_user_input',
          ),
        'connection reset',
      );
      const messageId = await f.userSays('retry me', session);
      await vi.waitFor(() => expect(session.lastError).toBeInstanceOf(Error));
      expect(f.answers()).toEqual([]);
      await session.close();

      const next = await f.newSession(echoTestAgent());
      await next.start();
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: retry me', messageId]]));
      await next.close();
    });

    it('reads before trying again when a write committed but its answer was lost: one answer', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.start();
      f.store.afterAppend = failOnce(hasAgentEvent, 'connection reset after commit');
      const messageId = await f.userSays('once only', session);
      await vi.waitFor(() => expect(session.lastError).toBeInstanceOf(Error));
      f.clock.advance(CATCH_UP_MS);
      await f.userSays('and this', session);
      await vi.waitFor(() => expect(f.answers()).toHaveLength(2));
      expect(f.answers()).toEqual([
        ['echo: once only', messageId],
        ['echo: and this', messageId + 4],
      ]);
      await session.close();
    });

    it('without a poll of its own, asks its holder to wake it after a failed write', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent(), 10, 0);
      await session.start();
      f.store.beforeAppend = failOnce(hasAgentEvent, 'connection reset');
      const messageId = await f.userSays('retry me', session);
      await vi.waitFor(() => expect(session.wantsRetry).toBe(true));
      f.clock.advance(10 * CATCH_UP_MS);
      expect(f.answers()).toEqual([]);
      session.wake();
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: retry me', messageId]]));
      expect(session.wantsRetry).toBe(false);
      await session.close();
    });

    it('retries a failed store write on the next catch-up poll within the same session', async () => {
      const f = await fixture();
      const session = await f.newSession(echoTestAgent());
      await session.start();
      f.store.beforeAppend = failOnce(hasAgentEvent, 'connection reset');
      const messageId = await f.userSays('retry me', session);
      await vi.waitFor(() => expect(session.lastError).toBeInstanceOf(Error));
      f.clock.advance(CATCH_UP_MS);
      await vi.waitFor(() => expect(f.answers()).toEqual([['echo: retry me', messageId]]));
      await session.close();
    });
  });
});
