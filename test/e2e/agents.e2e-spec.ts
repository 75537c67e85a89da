// The llm and http agents end to end, through the standalone app built in
// dist/: a local OpenAI-compatible model server, a real MCP server and the
// Python example agent, all started by the test; a Socket.IO client and REST
// as a client sees them.
import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ActionEvent, ServerEvent, StoredEvent } from '@cs/protocol';
import { FakeModelServer, openAiCompletion, openAiStream } from '../fakes/fake-model-server.js';
import { FakeMcpServer } from '../fakes/fake-mcp-server.js';
import { api, devToken, isAgentReply } from '../support/clients.js';
import { PROMPTLY_MS } from '../support/bounds.js';
import {
  isDelta,
  lastUser,
  metricsOf,
  openConversation,
  say,
  sayAndExpectStreamedReply,
  sayAndReadTitle,
  scriptTagged,
  storedEvents,
  streaming,
  toolResultsOf,
} from '../support/agent-e2e.js';
import { ROOT, startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';

const API_KEY = 'sk-e2e-THE-MODEL-KEY-0123456789';
const HMAC_SECRET = 'e2e-hmac-secret-0123456789abcdef';
const MCP_TOKEN = 'e2e-mcp-token-0123456789abcdef';
const PRICES = { 'fake-model': { input: 2, output: 10 } };

let model: FakeModelServer;
let mcp: FakeMcpServer;
let python: ChildProcess;
let app: AppProcess;
let dataDir: string;
let token: string;

async function startPython(): Promise<string> {
  python = spawn('python3', [join(ROOT, 'examples/http-agent-python/agent.py')], {
    env: { PATH: process.env.PATH, PORT: '0', AGENT_HTTP_SECRET: HMAC_SECRET, DELTA_PAUSE: '0.01' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines = createInterface({ input: python.stdout! });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the Python agent did not start')), 15_000);
    lines.on('line', (line) => {
      const found = /listening on (http:\/\/\S+)/.exec(line);
      if (found) {
        clearTimeout(timer);
        resolve(found[1]!);
      }
    });
  });
}

beforeAll(async () => {
  model = await FakeModelServer.start();
  mcp = await FakeMcpServer.start({ token: MCP_TOKEN });
  // Titles: one non-streamed request after the first answer of an untitled conversation.
  model.when((b) => !streaming(b), {
    kind: 'json',
    status: 200,
    body: openAiCompletion('A title from the model', { prompt_tokens: 20, completion_tokens: 4 }),
  });
  const pythonUrl = await startPython();
  dataDir = standaloneDataDir('cs-e2e-agents-');
  app = await startApp('standalone', {
    DATA_DIR: dataDir,
    AUTH_DEV_TOKENS: 'true',
    RATE_LIMIT_PER_MINUTE: '0',
    MAX_CONCURRENT_CONVERSATIONS: '20',
    LOG_LEVEL: 'debug',
    LLM_BASE_URL: `${model.url}/v1`,
    LLM_API_KEY: API_KEY,
    LLM_MODEL: 'fake-model',
    LLM_MAX_RETRIES: '2',
    LLM_PRICES: JSON.stringify(PRICES),
    MCP_SERVERS: JSON.stringify({
      files: { url: mcp.url, headers: { authorization: `Bearer ${MCP_TOKEN}` } },
    }),
    AGENT_HTTP_URL: pythonUrl,
    AGENT_HTTP_SECRET: HMAC_SECRET,
  });
  token = await devToken(app.url, { user_id: 'alice', tenant_id: uniqueName('tenant') });
});

afterAll(async () => {
  await app?.stop();
  python?.kill('SIGTERM');
  await mcp?.close();
  await model?.close();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** The last `count` messages of a Chat Completions request, as `{ role, content }`. */
const lastMessages = (body: Record<string, unknown>, count: number) =>
  ((body['messages'] ?? []) as { role: string; content: unknown }[])
    .slice(-count)
    .map(({ role, content }) => ({ role, content }));

const turnError = (events: ServerEvent[]) =>
  events.find(
    (e): e is StoredEvent =>
      'observation' in e &&
      e.observation === 'agent_state_changed' &&
      e.extras['agent_state'] === 'error',
  );

describe('the llm agent in the standalone app', () => {
  it('streams deltas to the socket before the final message, and stores only the message', async () => {
    scriptTagged(model, 'tag-stream', {
      kind: 'stream',
      delayMs: 30,
      events: openAiStream({
        text: ['Hello', ' there', ', friend'],
        usage: { prompt_tokens: 1000, completion_tokens: 500 },
      }),
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const { cause, replyAt } = await sayAndExpectStreamedReply(
        client,
        'tag-stream: greet me',
        'Hello there, friend',
        20_000,
      );
      const reply = client.events[replyAt] as StoredEvent & { args: { content: string } };
      expect(reply.args.content).toBe('Hello there, friend');

      const stored = await storedEvents(app.url, token, id);
      expect(stored.some((e) => (e as { stream?: unknown }).stream)).toBe(false);
      expect(stored.filter((e) => isAgentReply(e, cause))).toHaveLength(1);

      const metrics = await metricsOf(app.url, token, id);
      expect(metrics).toMatchObject({ prompt_tokens: 1000, completion_tokens: 500 });
      expect(metrics['cost_usd']).toBeCloseTo((1000 * 2 + 500 * 10) / 1e6, 9);
    } finally {
      client.close();
    }
  });

  it('runs a built-in and an MCP tool call and stores them linked; a failing tool is an is_error result and the turn goes on', async () => {
    scriptTagged(
      model,
      'tag-tools',
      {
        kind: 'stream',
        events: openAiStream({
          toolCalls: [
            { id: 'call_time', name: 'current_time', argumentPieces: ['{', '}'] },
            { id: 'call_echo', name: 'files__echo', argumentPieces: ['{"text":', '"from mcp"}'] },
            { id: 'call_fail', name: 'files__fail', argumentPieces: ['{}'] },
          ],
        }),
      },
      { kind: 'stream', events: openAiStream({ text: ['All three done.'] }) },
    );
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-tools: use the tools');
      await client.waitForReply(cause, 20_000);
      const stored = await storedEvents(app.url, token, id);
      const calls = stored.filter((e) => 'action' in e && e.action === 'tool_call');
      expect(calls.map((c) => ('args' in c ? c.args['tool'] : ''))).toEqual([
        'current_time',
        'files__echo',
        'files__fail',
      ]);
      for (const call of calls) {
        const callId = 'args' in call ? call.args['tool_call_id'] : undefined;
        const [result] = toolResultsOf(stored, callId);
        expect(result, String(callId)).toBeDefined();
        expect(result!.cause).toBe(call.id);
        if (callId === 'call_echo') expect(result!.content).toBe('from mcp');
        if (callId === 'call_time') expect(Date.parse(result!.content)).not.toBeNaN();
        expect(result!.extras['is_error']).toBe(callId === 'call_fail');
      }
      expect(stored.find((e) => isAgentReply(e, cause))).toMatchObject({
        args: { content: 'All three done.' },
      });
    } finally {
      client.close();
    }
  });

  it("ends the conversation's MCP sessions when it stops, and times each model request in /metrics", async () => {
    const requestsSeen = async () => {
      const metrics = await fetch(`${app.url}/metrics`).then((r) => r.text());
      const line = /^cs_llm_request_seconds_count(?:\{[^}]*\})? (\d+)/m.exec(metrics);
      return Number(line?.[1] ?? 0);
    };
    const requestsBefore = await requestsSeen();
    scriptTagged(
      model,
      'tag-mcp-end',
      {
        kind: 'stream',
        events: openAiStream({
          toolCalls: [{ id: 'call_e', name: 'files__echo', argumentPieces: ['{"text":"x"}'] }],
        }),
      },
      { kind: 'stream', events: openAiStream({ text: ['Done.'] }) },
    );
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-mcp-end: echo once');
      await client.waitForReply(cause, 20_000);
      expect(await requestsSeen()).toBeGreaterThanOrEqual(requestsBefore + 2);
      const closedBefore = mcp.sessionsClosed;
      const stop = await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token });
      expect(stop.status).toBe(200);
      await expect
        .poll(() => mcp.sessionsClosed, { timeout: 10_000 })
        .toBeGreaterThan(closedBefore);
    } finally {
      client.close();
    }
  });

  it('runs no tool outside agent_config.tools that the model calls anyway, MCP tools included', async () => {
    scriptTagged(
      model,
      'tag-allowed',
      {
        kind: 'stream',
        events: openAiStream({
          toolCalls: [
            { id: 'call_mcp', name: 'files__echo', argumentPieces: ['{"text":"leak"}'] },
            { id: 'call_ok', name: 'current_time', argumentPieces: ['{}'] },
          ],
        }),
      },
      { kind: 'stream', events: openAiStream({ text: ['Only the allowed one ran.'] }) },
    );
    const mcpCalls = mcp.metas.length;
    const { id, client } = await openConversation(app.url, token, {
      agent: 'llm',
      title: 'fixed',
      agent_config: { tools: ['current_time'] },
    });
    try {
      const cause = await say(client, 'tag-allowed: try them');
      await client.waitForReply(cause, 20_000);
      const request = model.streamed.find((r) => lastUser(r.body).includes('tag-allowed'))!;
      const offered = (request.body['tools'] as { function: { name: string } }[]).map(
        (t) => t.function.name,
      );
      expect(offered).toEqual(['current_time']);
      const stored = await storedEvents(app.url, token, id);
      expect(toolResultsOf(stored, 'call_mcp')).toMatchObject([
        { content: 'unknown tool: files__echo', extras: { is_error: true } },
      ]);
      expect(toolResultsOf(stored, 'call_ok')).toMatchObject([{ extras: { is_error: false } }]);
      expect(mcp.metas.length).toBe(mcpCalls);
    } finally {
      client.close();
    }
  });

  it('announces each retry with STATUS$LLM_RETRY, then answers', async () => {
    let tries = 0;
    model.when((b) => streaming(b) && lastUser(b).includes('tag-retry') && tries++ < 1, {
      kind: 'json',
      status: 429,
      body: { error: { message: 'slow down' } },
      headers: { 'retry-after': '0' },
    });
    scriptTagged(model, 'tag-retry', {
      kind: 'stream',
      events: openAiStream({ text: ['after a retry'] }),
    });
    const { client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-retry: once more');
      await client.waitForReply(cause, 20_000);
      expect(
        client.events.some(
          (e) =>
            (e as { status_update?: boolean; id?: unknown }).status_update &&
            (e as { id: unknown }).id === 'STATUS$LLM_RETRY',
        ),
      ).toBe(true);
    } finally {
      client.close();
    }
  });

  it('retries a stream cut after part of the answer: STATUS$LLM_RETRY, then the text afresh from offset 0, and only the retry is stored', async () => {
    let tries = 0;
    model.when((b) => streaming(b) && lastUser(b).includes('tag-cut-retry') && tries++ < 1, {
      kind: 'stream',
      events: openAiStream({ text: ['the first try'], finish: false }),
      cut: true,
    });
    scriptTagged(model, 'tag-cut-retry', {
      kind: 'stream',
      events: openAiStream({ text: ['the second ', 'try'] }),
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-cut-retry: go');
      await client.waitForReply(cause, 20_000);
      const retry = client.events.findIndex(
        (e) => (e as { id?: unknown }).id === 'STATUS$LLM_RETRY',
      );
      expect(retry).toBeGreaterThan(0);
      const deltas = (from: number, to: number) =>
        client.events
          .slice(from, to)
          .filter(isDelta)
          .filter((d) => d.cause === cause);
      expect(deltas(0, retry).map((d) => [d.offset, d.delta])).toEqual([[0, 'the first try']]);
      const after = deltas(retry, client.events.length);
      expect(after[0]?.offset).toBe(0);
      expect(after.map((d) => d.delta).join('')).toBe('the second try');
      const answers = (await storedEvents(app.url, token, id)).filter((e) =>
        isAgentReply(e, cause),
      );
      expect(answers).toHaveLength(1);
      expect(answers[0]).toMatchObject({ args: { content: 'the second try' } });
      expect(answers[0]).not.toMatchObject({ args: { interrupted: true } });
    } finally {
      client.close();
    }
  });

  it('ends the turn in llm_error with a safe message when the 500s outlast the retries', async () => {
    scriptTagged(model, 'tag-500', {
      kind: 'json',
      status: 500,
      body: { error: { message: `PROVIDER-SECRET-TEXT ${API_KEY}` } },
    });
    const { client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      await say(client, 'tag-500: fail please');
      await client.waitFor((events) => turnError(events) !== undefined, 30_000, 'llm_error');
      const error = turnError(client.events)!;
      expect(error).toMatchObject({ extras: { reason: 'llm_error' } });
      expect(JSON.stringify(error)).not.toContain('PROVIDER-SECRET-TEXT');
      expect(JSON.stringify(client.events)).not.toContain(API_KEY);
    } finally {
      client.close();
    }
  });

  it('does not store a cut stream as a complete answer', async () => {
    scriptTagged(model, 'tag-cut', {
      kind: 'stream',
      events: openAiStream({ text: ['half an ans'], finish: false }),
      cut: true,
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-cut: go');
      await client.waitFor((events) => turnError(events) !== undefined, 30_000, 'llm_error');
      expect(turnError(client.events)).toMatchObject({ extras: { reason: 'llm_error' } });
      // The partial text is kept, marked as interrupted: never as a complete answer.
      const answers = (await storedEvents(app.url, token, id)).filter((e) =>
        isAgentReply(e, cause),
      );
      expect(answers).toHaveLength(1);
      expect(answers[0]).toMatchObject({ args: { content: 'half an ans', interrupted: true } });
    } finally {
      client.close();
    }
  });

  it('closes the connection to the model server at once on a stop', async () => {
    scriptTagged(model, 'tag-stop', {
      kind: 'stream',
      events: openAiStream({ text: ['thinking very hard'], finish: false }),
      hang: true,
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      await say(client, 'tag-stop: think');
      await client.waitFor((events) => events.some(isDelta), 20_000, 'first delta');
      const request = model.streamed.find((r) => lastUser(r.body).includes('tag-stop'))!;
      const stoppedAt = Date.now();
      const stop = await api(app.url, 'POST', `/api/conversations/${id}/stop`, { token });
      expect(stop.status).toBe(200);
      expect((await request.closed) - stoppedAt).toBeLessThan(PROMPTLY_MS);
      await client.waitFor(
        (events) =>
          events.some((e) => 'action' in e && e.action === 'message' && e.source === 'agent'),
        10_000,
        'the interrupted message',
      );
      const partial = (await storedEvents(app.url, token, id)).find(
        (e) => 'action' in e && e.action === 'message' && e.source === 'agent',
      );
      expect(partial).toMatchObject({ args: { content: 'thinking very hard', interrupted: true } });
    } finally {
      client.close();
    }
  });

  it('stops a turn whose cost passes the conversation budget', async () => {
    // Every step calls a tool again, at $0.007 a step (1000 × $2/M + 500 × $10/M).
    scriptTagged(model, 'tag-budget', {
      kind: 'stream',
      events: openAiStream({
        toolCalls: [{ id: 'call_loop', name: 'current_time', argumentPieces: ['{}'] }],
        usage: { prompt_tokens: 1000, completion_tokens: 500 },
      }),
    });
    model.when((b) => streaming(b) && lastUser(b).includes('tag-budget'), {
      kind: 'stream',
      events: openAiStream({
        toolCalls: [{ id: 'call_again', name: 'current_time', argumentPieces: ['{}'] }],
        usage: { prompt_tokens: 1000, completion_tokens: 500 },
      }),
    });
    const { id, client } = await openConversation(app.url, token, {
      agent: 'llm',
      title: 'fixed',
      max_budget_usd: 0.01,
    });
    try {
      await say(client, 'tag-budget: loop');
      await client.waitFor((events) => turnError(events) !== undefined, 30_000, 'budget');
      expect(turnError(client.events)).toMatchObject({ extras: { reason: 'max_budget_exceeded' } });
      const steps = model.streamed.filter((r) => lastUser(r.body).includes('tag-budget'));
      expect(steps.length).toBeGreaterThanOrEqual(2);
      expect(steps.length).toBeLessThanOrEqual(3);
      expect((await metricsOf(app.url, token, id))['cost_usd']).toBeCloseTo(
        steps.length * 0.007,
        9,
      );
    } finally {
      client.close();
    }
  });

  it('closes the connection to the model server at once when a message interrupts the turn', async () => {
    scriptTagged(model, 'tag-interrupt', {
      kind: 'stream',
      events: openAiStream({ text: ['a long answer'], finish: false }),
      hang: true,
    });
    scriptTagged(model, 'tag-next', {
      kind: 'stream',
      events: openAiStream({ text: ['the next answer'] }),
    });
    const { client } = await openConversation(app.url, token, {
      agent: 'llm',
      title: 'fixed',
      multitask_strategy: 'interrupt',
    });
    try {
      await say(client, 'tag-interrupt: write');
      await client.waitFor((events) => events.some(isDelta), 20_000, 'first delta');
      const request = model.streamed.find((r) => lastUser(r.body).includes('tag-interrupt'))!;
      const sentAt = Date.now();
      const next = await say(client, 'tag-next: instead');
      expect((await request.closed) - sentAt).toBeLessThan(PROMPTLY_MS);
      await client.waitForReply(next, 20_000);
      // The interrupted text, stored after the message, comes before it in the next prompt.
      const nextRequest = model.streamed.find((r) => lastUser(r.body).includes('tag-next'))!;
      expect(lastMessages(nextRequest.body, 3)).toEqual([
        { role: 'user', content: 'tag-interrupt: write' },
        { role: 'assistant', content: 'a long answer' },
        { role: 'user', content: 'tag-next: instead' },
      ]);
    } finally {
      client.close();
    }
  });

  it("answers a message queued behind a turn with that turn's answer before it in the prompt, which ends with the message", async () => {
    scriptTagged(model, 'tag-first', {
      kind: 'stream',
      events: openAiStream({ text: ['the first ', 'answer'] }),
      delayMs: 150,
    });
    scriptTagged(model, 'tag-queued', {
      kind: 'stream',
      events: openAiStream({ text: ['the queued answer'] }),
    });
    const { client } = await openConversation(app.url, token, {
      agent: 'llm',
      title: 'fixed',
      multitask_strategy: 'enqueue',
    });
    try {
      const first = await say(client, 'tag-first: go');
      await client.waitFor((events) => events.some(isDelta), 20_000, 'first delta');
      const queued = await say(client, 'tag-queued: and then');
      await client.waitForReply(queued, 20_000);
      const answerTo = (cause: number) =>
        client.events.find((e): e is ActionEvent => isAgentReply(e, cause))?.args['content'];
      expect([answerTo(first), answerTo(queued)]).toEqual([
        'the first answer',
        'the queued answer',
      ]);
      // The first answer was stored after the queued message: the prompt puts it in its turn.
      const request = model.streamed.find((r) => lastUser(r.body).includes('tag-queued'))!;
      expect(lastMessages(request.body, 3)).toEqual([
        { role: 'user', content: 'tag-first: go' },
        { role: 'assistant', content: 'the first answer' },
        { role: 'user', content: 'tag-queued: and then' },
      ]);
    } finally {
      client.close();
    }
  });

  it('titles an untitled conversation with one model request', async () => {
    scriptTagged(model, 'tag-title', {
      kind: 'stream',
      events: openAiStream({ text: ['an answer'] }),
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm' });
    try {
      const conversation = { baseUrl: app.url, token, id };
      const title = await sayAndReadTitle(client, 'tag-title: name this', conversation, 20_000);
      expect(title).toBe('A title from the model');
    } finally {
      client.close();
    }
  });
});

describe('the http agent in the standalone app', () => {
  it('answers through the Python example: a tool call, its result, then the message', async () => {
    const { id, client } = await openConversation(app.url, token, {
      agent: 'http',
      title: 'fixed',
    });
    try {
      const cause = await say(client, 'What time is it?');
      await client.waitForReply(cause, 30_000);
      expect(client.events.filter(isDelta).length).toBeGreaterThan(0);
      const stored = await storedEvents(app.url, token, id);
      expect(stored.some((e) => 'action' in e && e.action === 'tool_call')).toBe(true);
      const reply = stored.find((e) => isAgentReply(e, cause)) as StoredEvent & {
        args: { content: string };
      };
      expect(reply.args.content).toMatch(/^It is \d{4}-\d\d-\d\dT.*\(UTC\)\.$/);
    } finally {
      client.close();
    }
  });
});

describe('secrets', () => {
  it('never writes the model key, the HMAC secret or MCP headers to the logs', () => {
    const output = app.output();
    expect(output.length).toBeGreaterThan(0);
    expect(output).not.toContain(API_KEY);
    expect(output).not.toContain(HMAC_SECRET);
    expect(output).not.toContain(MCP_TOKEN);
  });
});
