// Branching over REST, Socket.IO and SSE (docs/protocol.md "Branching: fork,
// rewind, edit, regenerate", issue 27): the same scenarios on a standalone
// app and on a cluster of two gateways (requests alternate between them)
// with a worker; then a worker killed right after a rewind is stored.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { createClient, type UndoneUpdate } from '@cs/client';
import { ConversationClient, api } from '../support/clients.js';
import {
  holderOf,
  readAllEvents,
  startCluster,
  until,
  type TestCluster,
} from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';
import { AGENT_MODULE, signFor } from '../support/agent-runtime.js';
import { FakeModelServer, openAiStream } from '../fakes/fake-model-server.js';

const SECRET = 'branching-e2e-secret-0123456789abcdef-01';

type Urls = () => [string, string];

async function created(url: string, token: string, body: Record<string, unknown>) {
  const answer = await api(url, 'POST', '/api/conversations', { token, body });
  expect(answer.status, JSON.stringify(answer.body)).toBe(201);
  return answer.body.conversation_id as string;
}

async function send(url: string, token: string, id: string, content: string) {
  const answer = await api(url, 'POST', `/api/conversations/${id}/events`, {
    token,
    body: { action: 'message', args: { content } },
  });
  expect(answer.status, JSON.stringify(answer.body)).toBe(201);
  return answer.body.event_id as number;
}

const isAnswer = (event: StoredEvent, cause?: number) =>
  event.source === 'agent' &&
  'action' in event &&
  event.action === 'message' &&
  event.args['interrupted'] !== true &&
  (cause === undefined || event.cause === cause);

/** Waits for the answer (not undone) to user message `cause`, and returns it. */
async function answerTo(url: string, token: string, id: string, cause: number) {
  let found: StoredEvent | undefined;
  await until(
    async () => {
      const events = await readAllEvents(url, token, id);
      found = events.find((e) => isAnswer(e, cause) && e.undone_by === undefined);
      return found !== undefined;
    },
    `the answer to ${cause}`,
    15_000,
  );
  return found as StoredEvent & { args: { content: string } };
}

function toolRuns(toolLog: string, tool: string): string[] {
  return readFileSync(toolLog, 'utf8')
    .split('\n')
    .filter((line) => line.startsWith(`${tool} start`));
}

function branchingScenarios(urls: Urls, token: () => Promise<string>, toolLog: () => string) {
  it('forks at an event: same events, ids and timestamps, the state as it was then, parent named, source untouched', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'history_teller', title: 'source' });
    const a = await send(first, user, id, 'set color=red');
    const answerA = await answerTo(first, user, id, a);
    const b = await send(second, user, id, 'set color=blue');
    await answerTo(first, user, id, b);
    const before = await readAllEvents(first, user, id);

    const fork = await api(second, 'POST', `/api/conversations/${id}/fork`, {
      token: user,
      body: { at_event_id: answerA.id },
    });
    expect(fork.status, JSON.stringify(fork.body)).toBe(201);
    expect(fork.body.conversation_status).toBe('STOPPED');
    const forkId = fork.body.conversation_id as string;
    const forked = await readAllEvents(first, user, forkId);
    expect(forked).toEqual(before.filter((e) => e.id <= answerA.id));

    const info = await api(first, 'GET', `/api/conversations/${forkId}`, { token: user });
    expect(info.body).toMatchObject({
      title: 'source',
      agent: 'history_teller',
      parent_conversation_id: id,
      forked_from_event_id: answerA.id,
      last_event_id: answerA.id,
    });
    const sourceInfo = await api(first, 'GET', `/api/conversations/${id}`, { token: user });
    expect(sourceInfo.body).toMatchObject({
      parent_conversation_id: null,
      forked_from_event_id: null,
    });

    const forkState = await api(first, 'GET', `/api/conversations/${forkId}/state`, {
      token: user,
    });
    const sourceState = await api(first, 'GET', `/api/conversations/${id}/state`, { token: user });
    expect(forkState.body.state).toEqual({ color: 'red' });
    expect(sourceState.body.state).toEqual({ color: 'blue' });
    expect(forkState.body.metrics).toEqual({
      iterations: 0,
      prompt_tokens: 0,
      completion_tokens: 0,
      cost_usd: 0,
    });

    // The fork goes on from its own point: its agent sees its own history and state.
    const c = await send(second, user, forkId, 'and now?');
    const answerC = await answerTo(first, user, forkId, c);
    expect(answerC.args.content).toBe('seen: set color=red | and now?; state: {"color":"red"}');
    expect(await readAllEvents(first, user, id)).toEqual(before);
  });

  it('forks a conversation mid-approval: no tool runs in the fork, the source goes on unchanged', async () => {
    const [first, second] = urls();
    const user = await token();
    const tag = uniqueName('approval');
    const id = await created(first, user, {
      agent: 'tool_user',
      agent_config: { tool: 'slow_once', arguments: { ms: 0 } },
      confirmation_mode: true,
    });
    const asked = await send(first, user, id, tag);
    await until(
      async () =>
        (await api(first, 'GET', `/api/conversations/${id}`, { token: user })).body.agent_state ===
        'awaiting_user_confirmation',
      'a confirmation asked for',
      15_000,
    );
    const runsBefore = toolRuns(toolLog(), 'slow_once').length;
    const fork = await api(second, 'POST', `/api/conversations/${id}/fork`, {
      token: user,
      body: {},
    });
    expect(fork.status).toBe(201);
    const forkId = fork.body.conversation_id as string;
    const forked = await readAllEvents(first, user, forkId);
    const call = forked.find((e) => 'action' in e && e.action === 'tool_call')!;
    expect(forked.at(-1)).toMatchObject({
      observation: 'tool_result',
      cause: call.id,
      extras: { is_error: true, forked: true },
    });
    // The fork is not awaiting anything: a confirmation there is refused, and nothing runs.
    const confirmFork = await api(first, 'POST', `/api/conversations/${forkId}/events`, {
      token: user,
      body: { action: 'change_agent_state', args: { agent_state: 'user_confirmed' } },
    });
    expect(confirmFork.status).toBe(400);
    const started = await api(first, 'POST', `/api/conversations/${forkId}/start`, { token: user });
    expect(started.status).toBe(200);

    // The source still awaits its answer, and runs the tool once when confirmed.
    const confirm = await api(second, 'POST', `/api/conversations/${id}/events`, {
      token: user,
      body: { action: 'change_agent_state', args: { agent_state: 'user_confirmed' } },
    });
    expect(confirm.status).toBe(201);
    const answer = await answerTo(first, user, id, asked);
    expect(answer.args.content).toBe('tool said: slept 0');
    expect(toolRuns(toolLog(), 'slow_once').length).toBe(runsBefore + 1);
  });

  it('forks a conversation mid-tool: the call is answered as forked in the fork and runs once, in the source', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, {
      agent: 'tool_user',
      agent_config: { tool: 'slow_once', arguments: { ms: 1500 } },
    });
    const runsBefore = toolRuns(toolLog(), 'slow_once').length;
    const asked = await send(first, user, id, 'run it');
    await until(
      () => toolRuns(toolLog(), 'slow_once').length > runsBefore,
      'the tool running',
      15_000,
    );
    const fork = await api(second, 'POST', `/api/conversations/${id}/fork`, {
      token: user,
      body: {},
    });
    expect(fork.status).toBe(201);
    const forkId = fork.body.conversation_id as string;
    const forked = await readAllEvents(first, user, forkId);
    expect(
      forked.filter((e) => 'observation' in e && e.observation === 'tool_result'),
    ).toMatchObject([{ extras: { is_error: true, forked: true } }]);
    // The fork's agent, started, answers nothing of the copied turn and runs no tool.
    await api(second, 'POST', `/api/conversations/${forkId}/start`, { token: user });
    const answer = await answerTo(first, user, id, asked);
    expect(answer.args.content).toBe('tool said: slept 1500');
    expect(toolRuns(toolLog(), 'slow_once').length).toBe(runsBefore + 1);
    expect((await readAllEvents(first, user, forkId)).some((e) => isAnswer(e))).toBe(false);
  });

  it('regenerates while a tool call awaits confirmation: the call is rejected with its turn, never runs, and is asked again', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, {
      agent: 'tool_user',
      agent_config: { tool: 'slow_once', arguments: { ms: 0 } },
      confirmation_mode: true,
    });
    const awaiting = () =>
      until(
        async () =>
          (await api(first, 'GET', `/api/conversations/${id}`, { token: user })).body
            .agent_state === 'awaiting_user_confirmation',
        'a confirmation asked for',
        15_000,
      );
    const runsBefore = toolRuns(toolLog(), 'slow_once').length;
    const asked = await send(first, user, id, uniqueName('pay'));
    await awaiting();
    const firstCall = (await readAllEvents(first, user, id)).find(
      (e) => 'action' in e && e.action === 'tool_call',
    )!;
    const regenerate = await api(second, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
    });
    expect(regenerate.status, JSON.stringify(regenerate.body)).toBe(201);
    const rewindId = regenerate.body.event_id as number;
    // The same message asks again, with a new call; the first is undone.
    await until(
      async () =>
        (await readAllEvents(first, user, id)).some(
          (e) => 'action' in e && e.action === 'tool_call' && e.id > rewindId,
        ),
      'the call asked again',
      15_000,
    );
    await awaiting();
    const events = await readAllEvents(first, user, id);
    expect(events.find((e) => e.id === firstCall.id)!.undone_by).toBe(rewindId);
    expect(events.find((e) => e.id === asked)!.undone_by).toBeUndefined();
    // A rewind to the call itself keeps it and answers it as rewound: it never runs either.
    const secondCall = events.find(
      (e) => 'action' in e && e.action === 'tool_call' && e.id > rewindId,
    )!;
    const rewind = await api(first, 'POST', `/api/conversations/${id}/rewind`, {
      token: user,
      body: { to_event_id: secondCall.id },
    });
    expect(rewind.status).toBe(200);
    const after = await readAllEvents(first, user, id);
    expect(after.find((e) => e.id === (rewind.body.event_id as number) + 1)).toMatchObject({
      observation: 'tool_result',
      cause: secondCall.id,
      extras: { is_error: true, rewound: true },
    });
    expect(toolRuns(toolLog(), 'slow_once').length).toBe(runsBefore);
  });

  it('rewinds during a streaming turn: the partial text is stored as interrupted, then undone, on every read path', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'waiter' });
    const socket = await ConversationClient.connect(first, user, { conversation_id: id });
    const quick = await send(first, user, id, 'quick one');
    const quickAnswer = await answerTo(first, user, id, quick);
    const long = await send(first, user, id, 'a long one');
    await socket.waitFor(
      (events) => events.some((e) => 'stream' in e && e.cause === long),
      15_000,
      'the long turn streaming',
    );
    const rewind = await api(second, 'POST', `/api/conversations/${id}/rewind`, {
      token: user,
      body: { to_event_id: quickAnswer.id },
    });
    expect(rewind.status, JSON.stringify(rewind.body)).toBe(200);
    const rewindId = rewind.body.event_id as number;

    const events = await readAllEvents(first, user, id);
    const partial = events.find(
      (e) =>
        e.source === 'agent' && 'action' in e && e.cause === long && e.args['interrupted'] === true,
    );
    expect(partial).toBeDefined();
    expect(partial!.undone_by).toBe(rewindId);
    expect(events.find((e) => e.id === long)!.undone_by).toBe(rewindId);
    expect(
      events
        .filter((e) => e.id > quickAnswer.id && e.id < rewindId)
        .every((e) => e.undone_by === rewindId),
    ).toBe(true);
    expect(
      events.filter((e) => e.id <= quickAnswer.id).every((e) => e.undone_by === undefined),
    ).toBe(true);
    expect(events.find((e) => e.id === rewindId)).toMatchObject({
      source: 'user',
      action: 'rewind',
      args: { to_event_id: quickAnswer.id },
    });
    // The live socket got the rewind event itself.
    await socket.waitFor(
      (received) => received.some((e) => 'id' in e && e.id === rewindId),
      10_000,
      'the rewind event live',
    );
    socket.close();

    // A socket replay and an SSE replay mark the undone events too.
    const replay = await ConversationClient.connect(second, user, {
      conversation_id: id,
      latest_event_id: '-1',
      start: 'false',
    });
    await replay.waitFor(
      (received) => received.some((e) => 'id' in e && e.id === rewindId),
      10_000,
      'the replay',
    );
    expect(replay.stored.find((e) => e.id === partial!.id)!.undone_by).toBe(rewindId);
    replay.close();
    const controller = new AbortController();
    const sse = await fetch(`${second}/api/conversations/${id}/stream`, {
      headers: { authorization: `Bearer ${user}`, 'last-event-id': '-1' },
      signal: controller.signal,
    });
    let text = '';
    const decoder = new TextDecoder();
    for await (const chunk of sse.body!) {
      text += decoder.decode(chunk as Uint8Array);
      if (text.includes(`id: ${rewindId}\n`)) break;
    }
    controller.abort();
    const replayed = text
      .split('\n')
      .filter((line) => line.startsWith('data: {"id":'))
      .map((line) => JSON.parse(line.slice(6)) as StoredEvent);
    expect(replayed.find((e) => e.id === partial!.id)!.undone_by).toBe(rewindId);

    // The next message is answered with a history that holds no undone event.
    const next = await send(first, user, id, 'quick two');
    const nextAnswer = await answerTo(first, user, id, next);
    expect(nextAnswer.args.content).toBe('answered: quick two');
  });

  it('edits a user message: the old one and what followed are undone, the new one answered with a history without them', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'history_teller' });
    const a = await send(first, user, id, 'set color=red');
    await answerTo(first, user, id, a);
    const b = await send(first, user, id, 'hello');
    await answerTo(first, user, id, b);

    const edit = await api(second, 'POST', `/api/conversations/${id}/events/${b}/edit`, {
      token: user,
      body: { content: 'set color=green' },
      headers: { 'idempotency-key': 'edit-1' },
    });
    expect(edit.status, JSON.stringify(edit.body)).toBe(201);
    const edited = edit.body.event_id as number;
    const answer = await answerTo(first, user, id, edited);
    expect(answer.args.content).toBe(
      'seen: set color=red | set color=green; state: {"color":"green"}',
    );
    // A repeat gives the first result and stores nothing.
    const last = (await api(first, 'GET', `/api/conversations/${id}`, { token: user })).body
      .last_event_id;
    const again = await api(first, 'POST', `/api/conversations/${id}/events/${b}/edit`, {
      token: user,
      body: { content: 'set color=green' },
      headers: { 'idempotency-key': 'edit-1' },
    });
    expect(again.status).toBe(200);
    expect(again.body.event_id).toBe(edited);
    expect(
      (await api(first, 'GET', `/api/conversations/${id}`, { token: user })).body.last_event_id,
    ).toBe(last);
    const events = await readAllEvents(first, user, id);
    expect(events.find((e) => e.id === b)!.undone_by).toBeDefined();
    // The turn of the edited message is undone; the new one's completed.
    const oldTurn = await api(second, 'GET', `/api/conversations/${id}/turns/${b}`, {
      token: user,
    });
    expect(oldTurn.body.status).toBe('undone');
    const newTurn = await api(first, 'GET', `/api/conversations/${id}/turns/${edited}`, {
      token: user,
    });
    expect(newTurn.body.status).toBe('completed');
    // Exactly one answer per user message among the events not undone.
    const kept = events.filter((e) => e.undone_by === undefined);
    for (const message of kept.filter(
      (e) => e.source === 'user' && 'action' in e && e.action === 'message',
    )) {
      expect(kept.filter((e) => isAnswer(e, message.id))).toHaveLength(1);
    }
  });

  it('regenerates the last answer: the same message answered again, the old answer undone', async () => {
    const [first, second] = urls();
    const user = await token();
    const id = await created(first, user, { agent: 'history_teller' });
    const a = await send(first, user, id, 'one');
    await answerTo(first, user, id, a);
    const b = await send(first, user, id, 'two');
    const old = await answerTo(first, user, id, b);

    const regenerate = await api(second, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
      headers: { 'idempotency-key': 'regen-1' },
    });
    expect(regenerate.status, JSON.stringify(regenerate.body)).toBe(201);
    const rewindId = regenerate.body.event_id as number;
    const fresh = await answerTo(first, user, id, b);
    expect(fresh.id).toBeGreaterThan(rewindId);
    expect(fresh.args.content).toBe('seen: one | two; state: {}');
    const events = await readAllEvents(first, user, id);
    expect(events.find((e) => e.id === old.id)!.undone_by).toBe(rewindId);
    expect(events.find((e) => e.id === rewindId)).toMatchObject({
      action: 'rewind',
      args: { to_event_id: b },
    });
    const again = await api(first, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
      headers: { 'idempotency-key': 'regen-1' },
    });
    expect(again.status).toBe(200);
    expect(again.body.event_id).toBe(rewindId);
  });

  it('refuses bad points with 400 naming the field, a stranger with 404, and answers repeats with the first result', async () => {
    const [first, second] = urls();
    const user = await token();
    const stranger = await token();
    const id = await created(first, user, { agent: 'history_teller' });
    const empty = await api(first, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
    });
    expect(empty.status).toBe(400);
    const a = await send(first, user, id, 'one');
    const answer = await answerTo(first, user, id, a);
    // Settled, so that nothing is stored meanwhile: the checks below see every write.
    let last = -1;
    await until(async () => {
      const info = await api(first, 'GET', `/api/conversations/${id}`, { token: user });
      last = info.body.last_event_id as number;
      return info.body.agent_state === 'awaiting_user_input';
    }, 'the turn settled');

    const bad = async (path: string, body: unknown, field: string) => {
      const response = await api(second, 'POST', `/api/conversations/${id}/${path}`, {
        token: user,
        body,
      });
      expect(response.status, `${path} ${JSON.stringify(body)}`).toBe(400);
      expect(response.body.error).toMatchObject({ code: 'BAD_REQUEST', field });
    };
    await bad('fork', { at_event_id: last + 1 }, 'at_event_id');
    await bad('fork', { at_event_id: -1 }, 'at_event_id');
    await bad('fork', { at_event_id: 'one' }, 'at_event_id');
    await bad('rewind', { to_event_id: last + 1 }, 'to_event_id');
    await bad('rewind', { to_event_id: -1 }, 'to_event_id');
    await bad('rewind', {}, 'to_event_id');
    await bad('rewind', { to_event_id: 0, extra: 1 }, 'extra');
    await bad(`events/${answer.id}/edit`, { content: 'x' }, 'event_id');
    await bad(`events/${last + 5}/edit`, { content: 'x' }, 'event_id');
    await bad(`events/${a}/edit`, {}, 'content');
    expect(
      (await api(first, 'GET', `/api/conversations/${id}`, { token: user })).body.last_event_id,
    ).toBe(last);

    for (const [path, body] of [
      ['fork', {}],
      ['rewind', { to_event_id: 0 }],
      [`events/${a}/edit`, { content: 'x' }],
      ['regenerate', {}],
    ] as const) {
      const response = await api(first, 'POST', `/api/conversations/${id}/${path}`, {
        token: stranger,
        body,
      });
      expect(response.status, path).toBe(404);
    }

    const forkOnce = () =>
      api(first, 'POST', `/api/conversations/${id}/fork`, {
        token: user,
        body: { at_event_id: a },
        headers: { 'idempotency-key': 'fork-1' },
      });
    const forked = await forkOnce();
    expect(forked.status).toBe(201);
    const repeated = await forkOnce();
    expect(repeated.status).toBe(200);
    expect(repeated.body.conversation_id).toBe(forked.body.conversation_id);

    const rewindOnce = () =>
      api(second, 'POST', `/api/conversations/${id}/rewind`, {
        token: user,
        body: { to_event_id: a },
        headers: { 'idempotency-key': 'rewind-1' },
      });
    const rewound = await rewindOnce();
    expect(rewound.status).toBe(200);
    expect((await rewindOnce()).body.event_id).toBe(rewound.body.event_id);
    const conflict = await api(second, 'POST', `/api/conversations/${id}/rewind`, {
      token: user,
      body: { to_event_id: answer.id },
      headers: { 'idempotency-key': 'rewind-1' },
    });
    expect(conflict.status).toBe(409);
    // Rewinding onto an undone event names the field too.
    await bad('rewind', { to_event_id: answer.id }, 'to_event_id');
  });
}

describe('branching: a standalone app', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  const tenant = uniqueName('branching');
  const toolLog = join(mkdtempSync(join(tmpdir(), 'cs-branching-')), 'tools.log');

  beforeAll(async () => {
    writeFileSync(toolLog, '');
    db = await createScratchDatabase('cs_branching_e2e', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AGENT_MODULES: AGENT_MODULE,
      CS_TEST_TOOL_LOG: toolLog,
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
    rmSync(dirname(toolLog), { recursive: true, force: true });
  });

  branchingScenarios(
    () => [app.url, app.url],
    () => signFor(SECRET, uniqueName('user'), tenant),
    () => toolLog,
  );

  it('offers fork, rewind, edit and regenerate in the SDK, and tells a live conversation what was undone', async () => {
    const token = await signFor(SECRET, uniqueName('user'), tenant);
    const client = createClient({ url: app.url, token });
    const { conversation_id: id } = await client.conversations.create({ agent: 'history_teller' });
    const live = client.conversation(id);
    const undone: UndoneUpdate[] = [];
    live.on('undone', (update) => undone.push(update));
    await live.connect();
    const { eventId: a } = await live.send('one');
    await answerTo(app.url, token, id, a);
    const { eventId: b } = await live.send('two');
    await answerTo(app.url, token, id, b);

    const fork = await client.conversations.fork(id, { at_event_id: a }, { idempotencyKey: 'f' });
    expect(await client.conversations.get(fork.conversation_id)).toMatchObject({
      parent_conversation_id: id,
      forked_from_event_id: a,
    });
    const regenerated = await client.conversations.regenerate(id);
    await until(() => undone.length === 1, 'the undone update', 10_000);
    expect(undone[0]).toMatchObject({ toEventId: b, rewind: { id: regenerated.event_id } });
    await answerTo(app.url, token, id, b);
    const edited = await client.conversations.edit(id, b, 'three');
    expect((await answerTo(app.url, token, id, edited.event_id)).args.content).toBe(
      'seen: one | three; state: {}',
    );
    const rewound = await client.conversations.rewind(id, a);
    await until(() => undone.length === 3, 'the undone updates', 10_000);
    expect(undone[2]).toMatchObject({ toEventId: a, rewind: { id: rewound.event_id } });
    const page = await client.conversations.events(id, { start_id: b, end_id: b });
    // Undone by the edit's rewind, which came after the regenerate's.
    expect(page.events[0]!.undone_by).toBeGreaterThan(regenerated.event_id);
    expect(page.events[0]!.undone_by).toBe(undone[1]!.rewind.id);
    const refused = await client.conversations.rewind(id, 10_000).catch((error: unknown) => error);
    expect(refused).toMatchObject({ code: 'BAD_REQUEST', field: 'to_event_id', status: 400 });
    live.close();
  });
});

describe('branching: the rate limit', () => {
  let app: AppProcess;
  let db: ScratchDatabase;

  beforeAll(async () => {
    db = await createScratchDatabase('cs_branching_limit', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      RATE_LIMIT_PER_MINUTE: '3',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
  });

  it('counts a fork as one action, refuses one beyond the limit, and answers a repeat anyway', async () => {
    const user = await signFor(SECRET, uniqueName('user'), uniqueName('tenant'));
    const id = await created(app.url, user, { title: 'limited' }); // action 1
    const fork = (key: string) =>
      api(app.url, 'POST', `/api/conversations/${id}/fork`, {
        token: user,
        body: {},
        headers: { 'idempotency-key': key },
      });
    const first = await fork('one'); // action 2
    expect(first.status).toBe(201);
    expect((await fork('two')).status).toBe(201); // action 3
    const refused = await fork('three');
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe('RATE_LIMITED');
    // A repeat stores nothing: not refused, the first fork again.
    const repeat = await fork('one');
    expect(repeat.status).toBe(200);
    expect(repeat.body.conversation_id).toBe(first.body.conversation_id);
    const listed = await api(app.url, 'GET', '/api/conversations?limit=10', { token: user });
    expect(listed.body.results).toHaveLength(3);
  });
});

describe('branching with the llm agent on the fake model server', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  let model: FakeModelServer;
  const tenant = uniqueName('branching-llm');

  beforeAll(async () => {
    model = await FakeModelServer.start();
    db = await createScratchDatabase('cs_branching_llm', { migrated: true });
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      LLM_BASE_URL: `${model.url}/v1`,
      LLM_API_KEY: 'sk-branching-test',
      LLM_MODEL: 'fake-model',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
    await model?.close();
  });

  /** What the model was sent in its last streamed request, as one text. */
  const lastPrompt = () => JSON.stringify(model.requests.at(-1)!.body['messages']);

  it('sends the model no undone event after an edit or a regenerate', async () => {
    const user = await signFor(SECRET, uniqueName('user'), tenant);
    const reply = (text: string) => ({
      kind: 'stream' as const,
      events: openAiStream({ text: [text] }),
    });
    model.reply(
      reply('answer-alpha'),
      reply('answer-beta'),
      reply('answer-gamma'),
      reply('answer-gamma-2'),
    );
    const id = await created(app.url, user, { agent: 'llm', title: 'fixed' });
    const alpha = await send(app.url, user, id, 'question-alpha');
    await answerTo(app.url, user, id, alpha);
    const beta = await send(app.url, user, id, 'question-beta');
    await answerTo(app.url, user, id, beta);

    const edit = await api(app.url, 'POST', `/api/conversations/${id}/events/${beta}/edit`, {
      token: user,
      body: { content: 'question-gamma' },
    });
    expect(edit.status).toBe(201);
    const gamma = edit.body.event_id as number;
    expect((await answerTo(app.url, user, id, gamma)).args.content).toBe('answer-gamma');
    const edited = lastPrompt();
    expect(edited).toContain('question-alpha');
    expect(edited).toContain('answer-alpha');
    expect(edited).toContain('question-gamma');
    expect(edited).not.toContain('question-beta');
    expect(edited).not.toContain('answer-beta');

    const regenerate = await api(app.url, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
    });
    expect(regenerate.status).toBe(201);
    await until(
      async () =>
        (await readAllEvents(app.url, user, id)).some(
          (e) =>
            isAnswer(e, gamma) &&
            e.undone_by === undefined &&
            e.id > (regenerate.body.event_id as number),
        ),
      'the regenerated answer',
      15_000,
    );
    const regenerated = lastPrompt();
    expect(regenerated).toContain('question-gamma');
    expect(regenerated).not.toContain('answer-gamma');
    expect(regenerated).not.toContain('question-beta');
    expect((await answerTo(app.url, user, id, gamma)).args.content).toBe('answer-gamma-2');
  });
});

describe('branching: a cluster of two gateways', () => {
  let cluster: TestCluster;
  const toolLog = join(mkdtempSync(join(tmpdir(), 'cs-branching-cluster-')), 'tools.log');

  beforeAll(async () => {
    writeFileSync(toolLog, '');
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: { AGENT_MODULES: AGENT_MODULE, CS_TEST_TOOL_LOG: toolLog, LEASE_TTL_MS: '3000' },
    });
  });

  afterAll(async () => {
    await cluster?.close();
    rmSync(dirname(toolLog), { recursive: true, force: true });
  });

  branchingScenarios(
    () => [cluster.gateways[0]!.url, cluster.gateways[1]!.url],
    () => cluster.token(uniqueName('user')),
    () => toolLog,
  );

  it('honours a rewind on the next holder when the worker is killed right after it is stored', async () => {
    const [first, second] = [cluster.gateways[0]!.url, cluster.gateways[1]!.url];
    const user = await cluster.token(uniqueName('user'));
    const id = await created(first, user, { agent: 'history_teller' });
    const a = await send(first, user, id, 'keep');
    await answerTo(first, user, id, a);
    const b = await send(first, user, id, 'drop');
    const old = await answerTo(first, user, id, b);
    const regenerate = await api(second, 'POST', `/api/conversations/${id}/regenerate`, {
      token: user,
      body: {},
    });
    expect(regenerate.status).toBe(201);
    const rewindId = regenerate.body.event_id as number;
    // The regenerate started the agent again: its holder dies at once, whatever it did.
    const holder = await holderOf(cluster.workers, id, 15_000);
    holder.signal('SIGKILL');
    const answer = await answerTo(second, user, id, b);
    expect(answer.id).toBeGreaterThan(rewindId);
    expect(answer.args.content).toBe('seen: keep | drop; state: {}');
    const events = await readAllEvents(first, user, id);
    expect(events.find((e) => e.id === old.id)!.undone_by).toBe(rewindId);
    const kept = events.filter((e) => e.undone_by === undefined);
    expect(kept.filter((e) => isAnswer(e, b))).toHaveLength(1);
    expect(kept.filter((e) => isAnswer(e, a))).toHaveLength(1);
  });
});
