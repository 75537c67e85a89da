// The agent runtime from outside, on the standalone app: agents written as an
// agent module (test/fixtures/agents/scripted-agents.mjs) stream, call tools,
// wait for approval, get interrupted and hit their limits.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ServerEvent, StoredEvent } from '@cs/protocol';
import {
  AGENT_MODULE,
  assemble,
  deltasOf,
  expectSignalAbortedOnlyWhenCut,
  signFor,
  watchSse,
} from '../support/agent-runtime.js';
import { storedEvents } from '../support/agent-e2e.js';
import { ConversationClient, api, isAgentReply } from '../support/clients.js';
import { MID_STEP_DELAY_MS, PROMPTLY_MS } from '../support/bounds.js';
import { until } from '../support/cluster.js';
import { standaloneDataDir } from '../support/migrated-template.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { createScratchDatabase, uniqueName, type ScratchDatabase } from '../support/services.js';

const SECRET = 'runtime-secret-0123456789abcdef-0123';
type ActionEvent = StoredEvent & { action: string; args: Record<string, unknown> };

function agentMessages(events: ServerEvent[], cause: number): ActionEvent[] {
  return events.filter(
    (e): e is ActionEvent =>
      'action' in e && e.source === 'agent' && e.action === 'message' && e.cause === cause,
  );
}

describe('agent runtime (standalone)', () => {
  let app: AppProcess;
  let db: ScratchDatabase;
  let dir: string;
  let toolLog: string;
  const tenant = uniqueName('runtime');

  beforeAll(async () => {
    db = await createScratchDatabase('cs_runtime', { migrated: true });
    dir = mkdtempSync(join(tmpdir(), 'cs-runtime-'));
    toolLog = join(dir, 'tools.log');
    writeFileSync(toolLog, '');
    // The README's example module, as a reader would copy it.
    const readme = readFileSync(join(import.meta.dirname, '../../README.md'), 'utf8');
    const example = /```js\n(\/\/ my-agents\.mjs[\s\S]*?)```/.exec(readme);
    if (!example) throw new Error('README.md has no my-agents.mjs example');
    const readmeModule = join(dir, 'my-agents.mjs');
    writeFileSync(readmeModule, example[1]!);
    app = await startApp('standalone', {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AGENT_MODULES: `${AGENT_MODULE},${readmeModule}`,
      CS_TEST_TOOL_LOG: toolLog,
      MAX_BUDGET_PER_TASK_USD: '1',
      MAX_CONCURRENT_CONVERSATIONS: '20',
    });
  });

  afterAll(async () => {
    await app?.stop();
    await db?.drop();
    rmSync(dir, { recursive: true, force: true });
  });

  async function conversation(token: string, body: Record<string, unknown>): Promise<string> {
    const created = await api(app.url, 'POST', '/api/conversations', { token, body });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    return created.body.conversation_id as string;
  }

  const userToken = () => signFor(SECRET, uniqueName('user'), tenant);

  it("runs the README's example module: each turn calls for the time and answers with it, also a turn that waited behind another", async () => {
    const token = await userToken();
    const id = await conversation(token, { agent: 'clock', multitask_strategy: 'enqueue' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    try {
      // The second message waits behind the first: its history then holds the first
      // turn's call and result, stored after it.
      const [first, second] = await Promise.all([
        client.message('time?'),
        client.message('again?'),
      ]);
      const causes = [first, second].map((ack) => (ack as { event_id: number }).event_id);
      for (const cause of causes) await client.waitForReply(cause);
      for (const cause of causes) {
        const [answer] = agentMessages(client.events, cause);
        expect(answer?.args['content']).toMatch(/^It is 20\d\d-\d\d-\d\dT[\d:.]+Z\.$/);
        const calls = client.events.filter(
          (e) => 'action' in e && e.action === 'tool_call' && e.cause === cause,
        );
        expect(calls).toHaveLength(1);
      }
    } finally {
      client.close();
    }
  });

  it('streams deltas in order with offsets; the stored message is their text; a late joiner gets the text so far first', async () => {
    const token = await userToken();
    const text = 'Streaming is the art of saying a long thing one small piece at a time.';
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { text, chunks: 20, delay_ms: MID_STEP_DELAY_MS },
    });
    const early = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const ack = await early.message('go');
    const cause = (ack as { event_id: number }).event_id;
    // Join mid-step, by socket and by SSE.
    await early.waitFor((events) => deltasOf(events, cause).length >= 5);
    const late = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const sse = await watchSse(app.url, id, token, cause);
    await early.waitForReply(cause);
    await late.waitForReply(cause);
    const sseDeltas = await sse.deltasUntilAnswer();

    const deltas = deltasOf(early.events, cause);
    expect(deltas.length).toBeGreaterThan(5);
    let expected = 0;
    for (const delta of deltas) {
      expect(delta.offset).toBe(expected);
      expected += delta.delta.length;
    }
    expect(assemble(deltas)).toBe(text);
    const [stored] = agentMessages(early.events, cause);
    expect(stored?.args['content']).toBe(text);
    // Deltas are never stored.
    expect(JSON.stringify(await storedEvents(app.url, token, id))).not.toContain('"stream"');

    const lateDeltas = deltasOf(late.events, cause);
    expect(lateDeltas[0]?.offset).toBe(0);
    expect(lateDeltas[0]!.delta.length).toBeGreaterThan(0);
    expect(lateDeltas[1]?.offset).toBe(lateDeltas[0]!.delta.length);
    expect(assemble(lateDeltas)).toBe(text);
    expect(sseDeltas[0]?.offset).toBe(0);
    expect(assemble(sseDeltas)).toBe(text);
    early.close();
    late.close();
  });

  it('gives the text so far to the first client that joins mid-step: the only client reconnecting, or an SSE stream of a message sent over REST', async () => {
    const token = await userToken();
    const text = 'A reconnecting client sees the whole answer being written, from its start.';
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { text, chunks: 20, delay_ms: MID_STEP_DELAY_MS },
    });
    const only = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const cause = ((await only.message('go')) as { event_id: number }).event_id;
    await only.waitFor((events) => deltasOf(events, cause).length >= 3);
    only.close();
    // Nobody is connected while more of the step streams.
    await new Promise((resolve) => setTimeout(resolve, 250));
    const back = await ConversationClient.connect(app.url, token, { conversation_id: id });
    await back.waitForReply(cause);
    const deltas = deltasOf(back.events, cause);
    expect(deltas[0]?.offset).toBe(0);
    expect(deltas[0]!.delta.length).toBeGreaterThan(0);
    expect(assemble(deltas)).toBe(text);
    back.close();

    // A message sent over REST, nobody connected; an SSE stream opens mid-step.
    const sent = await api<{ event_id: number }>(
      app.url,
      'POST',
      `/api/conversations/${id}/events`,
      { token, body: { action: 'message', args: { content: 'again' } } },
    );
    expect(sent.status).toBe(201);
    await new Promise((resolve) => setTimeout(resolve, 250));
    const sse = await watchSse(app.url, id, token, sent.body.event_id);
    const sseDeltas = (await sse.deltasUntilAnswer()).filter(
      (delta) => delta.cause === sent.body.event_id,
    );
    expect(sseDeltas[0]?.offset).toBe(0);
    expect(sseDeltas[0]!.delta.length).toBeGreaterThan(0);
    expect(assemble(sseDeltas)).toBe(text);
  });

  it('stores a tool call and its result linked by cause; set_state with a user: key reaches the other conversations of the user', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'set_state', arguments: { key: 'user:color', value: 'teal' } },
      initial_user_msg: 'remember my color',
    });
    // The end of the turn: the state after its answer. (The session's start
    // settles at awaiting_user_input too, before it takes up the first message.)
    let events: StoredEvent[] = [];
    await until(async () => {
      events = await storedEvents(app.url, token, id);
      const answered = events.findIndex(
        (e) => 'action' in e && e.source === 'agent' && e.action === 'message',
      );
      return (
        answered !== -1 &&
        events
          .slice(answered)
          .some((e) => 'observation' in e && e.extras?.['agent_state'] === 'awaiting_user_input')
      );
    }, 'the turn');
    const call = events.find((e) => 'action' in e && e.action === 'tool_call')!;
    expect(call).toMatchObject({
      source: 'agent',
      args: { tool: 'set_state', arguments: { key: 'user:color', value: 'teal' } },
    });
    const result = events.find((e) => 'observation' in e && e.observation === 'tool_result')!;
    expect(result).toMatchObject({
      source: 'environment',
      cause: call.id,
      extras: {
        tool: 'set_state',
        tool_call_id: (call as unknown as { args: { tool_call_id: string } }).args.tool_call_id,
        is_error: false,
      },
    });
    expect(events.at(-2)).toMatchObject({
      action: 'message',
      args: { content: expect.stringContaining('tool said') },
    });
    const other = await conversation(token, {});
    const state = await api(app.url, 'GET', `/api/conversations/${other}/state`, { token });
    expect(state.body.state).toMatchObject({ 'user:color': 'teal' });
  });

  it("shows a running conversation's next step the user: key another conversation of the user set", async () => {
    const token = await userToken();
    const answersOf = async (id: string) =>
      (await storedEvents(app.url, token, id)).flatMap((e) =>
        e.source === 'agent' && 'action' in e && e.action === 'message' ? [e.args['content']] : [],
      );
    const teller = await conversation(token, {
      agent: 'state_teller',
      initial_user_msg: 'what is my color?',
    });
    await until(async () => (await answersOf(teller)).length === 1, 'the first answer');
    const setter = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'set_state', arguments: { key: 'user:color', value: 'teal' } },
      initial_user_msg: 'remember my color',
    });
    await until(async () => (await answersOf(setter)).length === 1, 'set_state and its answer');
    const sent = await api(app.url, 'POST', `/api/conversations/${teller}/events`, {
      token,
      body: { action: 'message', args: { content: 'and now?' } },
    });
    expect(sent.status).toBe(201);
    await until(async () => (await answersOf(teller)).length === 2, 'the second answer');

    expect(await answersOf(teller)).toEqual(['user:color is null', 'user:color is "teal"']);
    // One session all along: it was told of the change, it did not start afresh.
    const loadings = (await storedEvents(app.url, token, teller)).filter(
      (e) => 'observation' in e && e.extras?.['agent_state'] === 'loading',
    );
    expect(loadings).toHaveLength(1);
  });

  it('gives an unknown tool or bad arguments an is_error result, and the turn goes on', async () => {
    const token = await userToken();
    for (const config of [
      { tool: 'no_such_tool', arguments: {} },
      { tool: 'slow_idempotent', arguments: { ms: 'soon' } },
    ]) {
      const id = await conversation(token, {
        agent: 'tool_user',
        agent_config: config,
        initial_user_msg: 'try',
      });
      await until(async () => {
        const events = await storedEvents(app.url, token, id);
        return events.some((e) => e.source === 'agent' && 'action' in e && e.action === 'message');
      }, 'the answer');
      const events = await storedEvents(app.url, token, id);
      const result = events.find((e) => 'observation' in e && e.observation === 'tool_result');
      expect(result).toMatchObject({ extras: { is_error: true } });
      expect(
        events.find((e) => 'action' in e && e.action === 'message' && e.source === 'agent'),
      ).toMatchObject({
        args: { content: expect.stringContaining('[is_error]') },
      });
    }
  });

  it('asks for approval: confirm runs the call, reject tells the agent, a message meanwhile rejects and is answered next', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'current_time', arguments: {} },
      confirmation_mode: true,
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const awaiting = () =>
      client.waitFor(
        (events) =>
          events.filter(
            (e) => 'observation' in e && e.extras?.['agent_state'] === 'awaiting_user_confirmation',
          ).length >= waits,
        10_000,
        'awaiting confirmation',
      );
    let waits = 1;
    const first = ((await client.message('what time is it?')) as { event_id: number }).event_id;
    await awaiting();
    // Nothing ran yet.
    expect(client.stored.some((e) => 'observation' in e && e.observation === 'tool_result')).toBe(
      false,
    );
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_confirmed' } }),
    ).toMatchObject({ ok: true });
    await client.waitForReply(first);
    expect(agentMessages(client.events, first)[0]?.args['content']).toMatch(/tool said: \d{4}-/);

    waits = 2;
    const second = ((await client.message('again?')) as { event_id: number }).event_id;
    await awaiting();
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_rejected' } }),
    ).toMatchObject({ ok: true });
    await client.waitForReply(second);
    expect(agentMessages(client.events, second)[0]?.args['content']).toContain(
      '[is_error,rejected]',
    );

    waits = 3;
    const third = ((await client.message('and now?')) as { event_id: number }).event_id;
    await awaiting();
    const fourth = ((await client.message('never mind, hello')) as { event_id: number }).event_id;
    await client.waitFor(
      (events) =>
        events.some(
          (e) =>
            'observation' in e &&
            e.observation === 'tool_result' &&
            e.extras?.['is_error'] === true &&
            (e.cause ?? 0) > third,
        ),
      10_000,
      'the rejected call',
    );
    // The fourth message is a turn of its own: its tool call waits for approval too.
    waits = 4;
    await awaiting();
    expect(
      client.stored.some(
        (e) =>
          'observation' in e &&
          e.extras?.['agent_state'] === 'awaiting_user_confirmation' &&
          e.cause === fourth,
      ),
    ).toBe(true);
    // An answer when nothing waits is refused.
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_confirmed' } }),
    ).toMatchObject({ ok: true });
    await client.waitForReply(fourth);
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_rejected' } }),
    ).toMatchObject({
      ok: false,
      error: { code: 'BAD_REQUEST' },
    });
    client.close();
  });

  it('under reject, a message while calls await approval is taken, not AGENT_BUSY: it rejects them and is answered next', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'current_time', arguments: {} },
      confirmation_mode: true,
      multitask_strategy: 'reject',
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const awaitingFor = (cause: number) =>
      client.waitFor(
        (events) =>
          events.some(
            (e) =>
              'observation' in e &&
              e.extras?.['agent_state'] === 'awaiting_user_confirmation' &&
              e.cause === cause,
          ),
        10_000,
        `awaiting confirmation for ${cause}`,
      );
    const first = ((await client.message('what time is it?')) as { event_id: number }).event_id;
    await awaitingFor(first);
    const reply = await api(app.url, 'POST', `/api/conversations/${id}/events`, {
      token,
      body: { action: 'message', args: { content: 'never mind' } },
    });
    expect(reply.status, JSON.stringify(reply.body)).toBe(201);
    const second = reply.body['event_id'] as number;
    await awaitingFor(second);
    const results = client.stored.filter(
      (e) => 'observation' in e && e.observation === 'tool_result',
    );
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({ extras: { is_error: true } });
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_confirmed' } }),
    ).toMatchObject({ ok: true });
    await client.waitForReply(second);
    expect(agentMessages(client.events, second)[0]?.args['content']).toMatch(/tool said: \d{4}-/);
    client.close();
  });

  it("aborts an agent module's signal only when its turn is cut: not when it answers under enqueue or reject with a message sent meanwhile; an interrupt aborts it at once", async () => {
    const token = await userToken();
    await expectSignalAbortedOnlyWhenCut(app.url, token, toolLog, (body) =>
      conversation(token, body),
    );
  });

  it('interrupt cuts the running step at once and answers the new message; enqueue answers each once in order; reject refuses with AGENT_BUSY, yet acknowledges a repeat of the message it answers', async () => {
    const token = await userToken();
    const interrupting = await conversation(token, {
      agent: 'waiter',
      multitask_strategy: 'interrupt',
    });
    const client = await ConversationClient.connect(app.url, token, {
      conversation_id: interrupting,
    });
    const slow = ((await client.message('take your time')) as { event_id: number }).event_id;
    await client.waitFor((events) => deltasOf(events, slow).length >= 2);
    const sentAt = Date.now();
    const quick = ((await client.message('quick one')) as { event_id: number }).event_id;
    await client.waitForReply(quick);
    const aborted = readFileSync(toolLog, 'utf8')
      .split('\n')
      .filter((l) => l.startsWith('aborted'))
      .map((l) => Number(l.split(' ')[1]));
    expect(aborted.some((at) => at >= sentAt && at - sentAt < PROMPTLY_MS)).toBe(true);
    const cut = agentMessages(client.events, slow);
    expect(cut).toHaveLength(1);
    expect(cut[0]?.args).toMatchObject({ interrupted: true });
    expect(agentMessages(client.events, quick)[0]?.args['content']).toBe('answered: quick one');
    client.close();

    const queueing = await conversation(token, {
      agent: 'streamer',
      agent_config: { chunks: 3, delay_ms: 30 },
    });
    const queue = await ConversationClient.connect(app.url, token, { conversation_id: queueing });
    const ids = [];
    for (const text of ['one', 'two', 'three'])
      ids.push(((await queue.message(text)) as { event_id: number }).event_id);
    for (const id of ids) await queue.waitForReply(id);
    const replies = queue.stored.filter(
      (e) => e.source === 'agent' && 'action' in e && e.action === 'message',
    );
    expect(replies.map((e) => e.cause)).toEqual(ids);
    queue.close();

    const rejecting = await conversation(token, { agent: 'waiter', multitask_strategy: 'reject' });
    const busy = await ConversationClient.connect(app.url, token, { conversation_id: rejecting });
    const running = ((await busy.message('take your time', 'key-running')) as { event_id: number })
      .event_id;
    await busy.waitFor((events) => deltasOf(events, running).length >= 1);
    expect(await busy.message('me too')).toMatchObject({
      ok: false,
      error: { code: 'AGENT_BUSY' },
    });
    // The message being answered, sent again (its first ack lost): acknowledged, not refused.
    expect(await busy.message('take your time', 'key-running')).toEqual({
      ok: true,
      event_id: running,
    });
    const repeated = await api(app.url, 'POST', `/api/conversations/${rejecting}/events`, {
      token,
      body: { action: 'message', args: { content: 'take your time' } },
      headers: { 'idempotency-key': 'key-running' },
    });
    expect([repeated.status, repeated.body.event_id]).toEqual([200, running]);
    expect(await busy.message('other words', 'key-running')).toMatchObject({
      ok: false,
      error: { code: 'CONFLICT' },
    });
    const rest = await api(app.url, 'POST', `/api/conversations/${rejecting}/events`, {
      token,
      body: { action: 'message', args: { content: 'me too' } },
    });
    expect(rest.status).toBe(409);
    expect(rest.body).toMatchObject({ error: { code: 'AGENT_BUSY' } });
    const events = await storedEvents(app.url, token, rejecting);
    expect(events.filter((e) => e.source === 'user')).toHaveLength(1);
    expect(
      await busy.send({ action: 'change_agent_state', args: { agent_state: 'stopped' } }),
    ).toMatchObject({ ok: true });
    busy.close();
  });

  it('reject accepts one of many messages sent at the same moment, and refuses the others with AGENT_BUSY', async () => {
    const token = await userToken();
    const id = await conversation(token, { agent: 'waiter', multitask_strategy: 'reject' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    // The agent is idle: all of them reach the door before the first turn stores `running`.
    const sends = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        api(app.url, 'POST', `/api/conversations/${id}/events`, {
          token,
          body: { action: 'message', args: { content: `at once ${i}` } },
        }),
      ),
    );
    const statuses = sends.map((send) => send.status).sort();
    expect(statuses.filter((status) => status === 409)).toHaveLength(7);
    const events = await storedEvents(app.url, token, id);
    expect(events.filter((e) => e.source === 'user')).toHaveLength(1);
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'stopped' } }),
    ).toMatchObject({ ok: true });
    client.close();
  });

  it('stops a running step at once, storing its partial text as interrupted', async () => {
    const token = await userToken();
    const id = await conversation(token, { agent: 'waiter' });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const slow = ((await client.message('take your time')) as { event_id: number }).event_id;
    await client.waitFor((events) => deltasOf(events, slow).length >= 3);
    const sentAt = Date.now();
    const stopped = await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token });
    expect(stopped.body).toEqual({ conversation_status: 'STOPPED' });
    expect(Date.now() - sentAt).toBeLessThan(PROMPTLY_MS);
    await client.waitFor((events) => agentMessages(events, slow).length === 1);
    const [partial] = agentMessages(client.events, slow);
    expect(partial?.args).toMatchObject({ interrupted: true });
    expect(String(partial?.args['content'])).toMatch(/^0 1 2 /);
    client.close();
  });

  it('answers a tool call a stop cut with an is_error tool_result before the turn settles, counts it cancelled, and answers the next message', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'slow_once', arguments: { ms: 2000 } },
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const first = ((await client.message('take your time')) as { event_id: number }).event_id;
    const isCallOf = (e: ServerEvent, cause: number) =>
      'action' in e && e.action === 'tool_call' && e.cause === cause;
    await client.waitFor((events) => events.some((e) => isCallOf(e, first)), 10_000, 'the call');
    const stopped = await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token });
    expect(stopped.body).toEqual({ conversation_status: 'STOPPED' });

    const events = await storedEvents(app.url, token, id);
    const call = events.find((e) => isCallOf(e, first)) as ActionEvent;
    const results = events.filter(
      (e) => 'observation' in e && e.observation === 'tool_result' && e.cause === call.id,
    );
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({
      source: 'environment',
      content: expect.stringContaining('stopped while this call ran'),
      extras: { tool: 'slow_once', tool_call_id: call.args['tool_call_id'], is_error: true },
    });
    const settled = events.find(
      (e) =>
        'observation' in e &&
        e.extras?.['agent_state'] === 'awaiting_user_input' &&
        e.cause === first,
    );
    expect(settled).toMatchObject({ extras: { reason: 'interrupted' } });
    expect(results[0]!.id).toBeLessThan(settled!.id);
    const metrics = await (await fetch(`${app.url}/metrics`)).text();
    expect(
      metrics
        .split('\n')
        .some(
          (line) =>
            line.startsWith('cs_tool_calls_total{') &&
            line.includes('tool="slow_once"') &&
            line.includes('outcome="cancelled"'),
        ),
    ).toBe(true);

    const second = ((await client.message('and now?')) as { event_id: number }).event_id;
    await client.waitForReply(second, 15_000);
    expect(agentMessages(client.events, second)[0]?.args['content']).toBe('tool said: slept 2000');
    client.close();
  });

  it('ends a step that streams more than an agent message may hold (1,048,577 characters) in agent_error, and stores the 1,048,576 that fit as interrupted', async () => {
    const token = await userToken();
    // 3 bytes a character in UTF-8, stored twice in the event: 6 MiB of JSON.
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { text: '中', repeat: 1_048_577, chunks: 68, delay_ms: 0 },
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const cause = ((await client.message('write a lot')) as { event_id: number }).event_id;
    await client.waitFor(
      (events) =>
        events.some(
          (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === cause,
        ),
      30_000,
      'the error',
    );
    const failure = client.stored.find(
      (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === cause,
    );
    expect(failure).toMatchObject({ extras: { reason: 'agent_error' } });
    const [partial] = agentMessages(client.stored, cause);
    expect(partial?.args).toMatchObject({ interrupted: true });
    expect(String(partial?.args['content'])).toBe('中'.repeat(1_048_576));
    const state = await api(app.url, 'GET', `/api/conversations/${id}/state`, { token });
    expect(state.body.metrics.iterations).toBe(1);
    client.close();
  });

  it('ends a turn at max_iterations and at the budget with their reasons, and answers the next message', async () => {
    const token = await userToken();
    for (const [body, reason] of [
      [{ agent: 'spender', agent_config: { cost: 0 }, max_iterations: 4 }, 'max_iterations'],
      [{ agent: 'spender', agent_config: { cost: 0.3 } }, 'max_budget_exceeded'],
    ] as const) {
      const id = await conversation(token, body);
      const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
      const first = ((await client.message('spend')) as { event_id: number }).event_id;
      await client.waitFor(
        (events) =>
          events.some(
            (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === first,
          ),
        15_000,
        reason,
      );
      const failure = client.stored.find(
        (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === first,
      )!;
      expect(failure).toMatchObject({ extras: { reason } });
      const state = await api(app.url, 'GET', `/api/conversations/${id}/state`, { token });
      if (reason === 'max_iterations') expect(state.body.metrics.iterations).toBe(4);
      else expect(state.body.metrics.cost_usd).toBeCloseTo(1.2, 5);
      expect(state.body.metrics.prompt_tokens).toBeGreaterThan(0);
      // The conversation stays usable: the next message is a new turn with fresh limits.
      const next = ((await client.message('again')) as { event_id: number }).event_id;
      await client.waitFor(
        (events) =>
          events.some(
            (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === next,
          ),
        15_000,
        'the next turn',
      );
      client.close();
    }
    expect(
      (
        await api(app.url, 'POST', '/api/conversations', {
          token,
          body: { agent: 'spender', max_iterations: 101 },
        })
      ).body,
    ).toMatchObject({ error: { code: 'BAD_REQUEST', field: 'max_iterations' } });
    expect(
      (
        await api(app.url, 'POST', '/api/conversations', {
          token,
          body: { agent: 'spender', max_budget_usd: 2 },
        })
      ).body,
    ).toMatchObject({ error: { code: 'BAD_REQUEST', field: 'max_budget_usd' } });
  });

  it('refuses an unknown agent and an agent_config over 16 KiB with BAD_REQUEST', async () => {
    const token = await userToken();
    expect(
      (await api(app.url, 'POST', '/api/conversations', { token, body: { agent: 'nobody' } })).body,
    ).toMatchObject({ error: { code: 'BAD_REQUEST', field: 'agent' } });
    const big = await api(app.url, 'POST', '/api/conversations', {
      token,
      body: { agent: 'streamer', agent_config: { text: 'x'.repeat(17 * 1024) } },
    });
    expect(big.status).toBe(400);
    expect(big.body).toMatchObject({ error: { code: 'BAD_REQUEST', field: 'agent_config' } });
  });

  it('ends a turn whose output the store refuses once, stores a safe message for a failing agent, and answers the next message', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'broken',
      agent_config: { host: 'db-7.internal' },
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    const poison = ((await client.message('poison')) as { event_id: number }).event_id;
    const next = ((await client.message('next')) as { event_id: number }).event_id;
    await client.waitForReply(next);
    const errors = client.stored.filter(
      (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === poison,
    );
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatchObject({ extras: { reason: 'agent_error' } });
    const thrown = ((await client.message('throw')) as { event_id: number }).event_id;
    await client.waitFor((events) =>
      events.some(
        (e) => 'observation' in e && e.extras?.['agent_state'] === 'error' && e.cause === thrown,
      ),
    );
    expect(JSON.stringify(client.events)).not.toContain('db-7.internal');
    const after = ((await client.message('after')) as { event_id: number }).event_id;
    await client.waitForReply(after);
    expect(client.stored.some((e) => isAgentReply(e, after))).toBe(true);
    client.close();
  });

  it('gives an untitled conversation a title after its first answer, announced to the room', async () => {
    const token = await userToken();
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { chunks: 2, delay_ms: 1 },
    });
    const client = await ConversationClient.connect(app.url, token, { conversation_id: id });
    await client.message(
      'What is the weather going to be like in Lisbon next weekend for a picnic?',
    );
    await client.waitFor((events) =>
      events.some((e) => 'status_update' in e && e.id === 'STATUS$TITLE_UPDATED'),
    );
    const info = await api(app.url, 'GET', `/api/conversations/${id}`, { token });
    expect(info.body.title).toBe('What is the weather going to be like in Lisbon next weekend');
    client.close();
  });
});

describe('the budget of a turn across kill -9 and a restart (standalone)', () => {
  it('ends the resumed turn at the budget, counting what its steps cost before the restart', async () => {
    const db = await createScratchDatabase('cs_budget', { migrated: true });
    const dir = mkdtempSync(join(tmpdir(), 'cs-budget-'));
    const toolLog = join(dir, 'tools.log');
    writeFileSync(toolLog, '');
    const env = {
      DATABASE_URL: db.url,
      AUTH_JWT_SECRET: SECRET,
      AGENT_MODULES: AGENT_MODULE,
      CS_TEST_TOOL_LOG: toolLog,
      MAX_BUDGET_PER_TASK_USD: '1',
    };
    let app = await startApp('standalone', env);
    try {
      const token = await signFor(SECRET, uniqueName('user'), uniqueName('budget'));
      const created = await api(app.url, 'POST', '/api/conversations', {
        token,
        body: {
          agent: 'spender',
          agent_config: { cost: 0.3, tool: 'slow_idempotent', arguments: { ms: 2_000 } },
          initial_user_msg: 'spend',
        },
      });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      const id = created.body.conversation_id as string;
      const toolRuns = () =>
        readFileSync(toolLog, 'utf8')
          .split('\n')
          .filter((line) => line.startsWith('slow_idempotent start')).length;
      // Two steps stored (0.6 of the budget), the second one's tool running.
      await until(() => toolRuns() >= 2, "the second step's tool", 30_000);
      app.signal('SIGKILL');
      await app.exited;
      app = await startApp('standalone', env);

      const events = async () =>
        (
          (await api(app.url, 'GET', `/api/conversations/${id}/events?limit=100`, { token }))
            .body as { events: StoredEvent[] }
        ).events;
      const isTurnError = (e: StoredEvent) =>
        'observation' in e && e.extras?.['agent_state'] === 'error';
      await until(async () => (await events()).some(isTurnError), 'the end of the turn', 60_000);
      const stored = await events();
      expect(stored.find(isTurnError)).toMatchObject({ extras: { reason: 'max_budget_exceeded' } });
      // 0.3 a step: the fourth passes 1. Counting from 0 after the restart, it would take six.
      const calls = stored.filter((e) => 'action' in e && e.action === 'tool_call');
      expect(calls).toHaveLength(4);
      const state = await api(app.url, 'GET', `/api/conversations/${id}/state`, { token });
      expect(state.body.metrics.cost_usd).toBeCloseTo(1.2, 5);
    } finally {
      await app.stop();
      await db.drop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('agent modules', () => {
  it('stops the process with one clear line when a module fails to load', async () => {
    // A copy of the migrated PGlite folder: the store opens before the modules
    // load, and a new folder would cost each start seconds of initdb.
    const dir = standaloneDataDir('cs-modules-');
    try {
      await expect(
        startApp('standalone', {
          DATA_DIR: dir,
          AGENT_MODULES: join(dir, 'missing-module.mjs'),
        }),
      ).rejects.toThrow(/AGENT_MODULES: .*missing-module\.mjs failed to load/);
      writeFileSync(
        join(dir, 'clash.mjs'),
        'export const agents = { echo: () => ({ async *step() {} }) };\n',
      );
      await expect(
        startApp('standalone', { DATA_DIR: dir, AGENT_MODULES: join(dir, 'clash.mjs') }),
      ).rejects.toThrow(/the agent name echo is taken/);
      // A default agent nobody registered: refused at start, not at each create.
      const refused = await startApp('standalone', { DATA_DIR: dir, AGENT: 'nope' }).then(
        () => null,
        (error: unknown) => String(error),
      );
      expect(refused).toMatch(/AGENT: no agent is named nope \(there are: .*echo/);
      // One line to read: the operator's mistake, without a stack.
      expect(refused).not.toMatch(/"stack"|\n\s+at /);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
