// The llm agent on Anthropic's Messages API end to end, through the
// standalone app built in dist/ with LLM_PROVIDER=anthropic: a local
// Messages server (real HTTP, real SSE events, each split across TCP writes)
// and a real MCP server, both started by the test; a Socket.IO client and
// REST as a client sees them.
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import {
  FakeAnthropicServer,
  anthropicStream,
  type AnthropicReply,
} from '../fakes/fake-anthropic-server.js';
import { FakeMcpServer } from '../fakes/fake-mcp-server.js';
import {
  metricsOf,
  openConversation,
  say,
  sayAndExpectStreamedReply,
  sayAndReadTitle,
  storedEvents,
  streaming,
  toolResultsOf,
} from '../support/agent-e2e.js';
import { devToken, isAgentReply } from '../support/clients.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { uniqueName } from '../support/services.js';
import { standaloneDataDir } from '../support/migrated-template.js';

const API_KEY = 'sk-ant-e2e-THE-ANTHROPIC-KEY-0123456789';
const MODEL = 'fake-claude';
const PRICES = { [MODEL]: { input: 3, output: 15 } };

let model: FakeAnthropicServer;
let mcp: FakeMcpServer;
let app: AppProcess;
let dataDir: string;
let token: string;

type Block = { type: string; text?: string; tool_use_id?: string; content?: unknown };
type Message = { role: string; content: string | Block[] };

const messagesOf = (body: Record<string, unknown>) => (body['messages'] ?? []) as Message[];
const blocksOf = (message: Message): Block[] =>
  typeof message.content === 'string' ? [{ type: 'text', text: message.content }] : message.content;
/** Whether a user message of the request carries `tag` in a text block. */
const tagged = (body: Record<string, unknown>, tag: string) =>
  messagesOf(body).some(
    (m) => m.role === 'user' && blocksOf(m).some((b) => b.type === 'text' && b.text?.includes(tag)),
  );
const toolResults = (body: Record<string, unknown>) =>
  messagesOf(body).flatMap((m) => blocksOf(m).filter((b) => b.type === 'tool_result'));

/** Scripts the model's answer to a user message tagged `tag` (first step, and after tool results). */
function script(tag: string, first: AnthropicReply, afterTools?: AnthropicReply): void {
  if (afterTools) {
    model.when((b) => streaming(b) && tagged(b, tag) && toolResults(b).length > 0, afterTools);
  }
  model.when((b) => streaming(b) && tagged(b, tag), first);
}

beforeAll(async () => {
  model = await FakeAnthropicServer.start({ apiKey: API_KEY });
  mcp = await FakeMcpServer.start();
  // Titles: one non-streamed request after the first answer of an untitled conversation.
  model.when((b) => !streaming(b), {
    kind: 'message',
    text: 'Claude picked this title',
    usage: { input_tokens: 30, output_tokens: 5 },
  });
  dataDir = standaloneDataDir('cs-e2e-anthropic-');
  app = await startApp('standalone', {
    DATA_DIR: dataDir,
    AUTH_DEV_TOKENS: 'true',
    RATE_LIMIT_PER_MINUTE: '0',
    MAX_CONCURRENT_CONVERSATIONS: '20',
    LOG_LEVEL: 'debug',
    LLM_PROVIDER: 'anthropic',
    LLM_BASE_URL: model.url,
    LLM_API_KEY: API_KEY,
    LLM_MODEL: MODEL,
    LLM_MAX_RETRIES: '1',
    LLM_PRICES: JSON.stringify(PRICES),
    MCP_SERVERS: JSON.stringify({ files: { url: mcp.url } }),
  });
  token = await devToken(app.url, { user_id: 'ada', tenant_id: uniqueName('tenant') });
});

afterAll(async () => {
  await app?.stop();
  await mcp?.close();
  await model?.close();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

describe('the llm agent on an Anthropic Messages server (standalone)', () => {
  it('streams deltas to the socket before the final message, stores only the message, and adds up usage', async () => {
    script('tag-stream', {
      kind: 'stream',
      delayMs: 30,
      events: anthropicStream({
        text: ['Bonjour', ' from', ' Claude'],
        usage: { input_tokens: 1200, output_tokens: 300 },
      }),
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const { cause, replyAt } = await sayAndExpectStreamedReply(
        client,
        'tag-stream: greet me',
        'Bonjour from Claude',
        30_000,
      );
      expect(client.events[replyAt]).toMatchObject({ args: { content: 'Bonjour from Claude' } });

      const stored = await storedEvents(app.url, token, id);
      expect(stored.some((e) => (e as { stream?: unknown }).stream)).toBe(false);
      const answers = stored.filter((e) => isAgentReply(e, cause));
      expect(answers).toHaveLength(1);
      expect(answers[0]).toMatchObject({ args: { content: 'Bonjour from Claude' } });
      expect((answers[0] as { args?: Record<string, unknown> }).args).not.toHaveProperty(
        'interrupted',
      );

      const metrics = await metricsOf(app.url, token, id);
      expect(metrics).toMatchObject({ prompt_tokens: 1200, completion_tokens: 300 });
      expect(metrics['cost_usd']).toBeCloseTo((1200 * 3 + 300 * 15) / 1e6, 9);

      // The request was the Messages API's, with the key where Anthropic wants it.
      const request = model.streamed.find((r) => tagged(r.body, 'tag-stream'))!;
      expect(request.path).toBe('/v1/messages');
      expect(request.headers['x-api-key']).toBe(API_KEY);
      expect(request.body).toMatchObject({ model: MODEL, stream: true });
    } finally {
      client.close();
    }
  });

  it('runs tool_use blocks whose input arrives in pieces, stores each call and result linked, answers after the tool results, and adds up both steps', async () => {
    script(
      'tag-tools',
      {
        kind: 'stream',
        events: anthropicStream({
          text: ['Let me check.'],
          toolUses: [
            { id: 'toolu_time_01', name: 'current_time', argumentPieces: ['', '{', '}'] },
            {
              id: 'toolu_echo_02',
              name: 'files__echo',
              argumentPieces: ['{"te', 'xt": "from ', 'cla', 'ude"}'],
            },
          ],
          usage: { input_tokens: 500, output_tokens: 60 },
        }),
      },
      {
        kind: 'stream',
        events: anthropicStream({
          text: ['Both tools ', 'answered.'],
          usage: { input_tokens: 700, output_tokens: 20 },
        }),
      },
    );
    const { id, client } = await openConversation(app.url, token, { agent: 'llm', title: 'fixed' });
    try {
      const cause = await say(client, 'tag-tools: use the tools');
      await client.waitForReply(cause, 30_000);
      const stored = await storedEvents(app.url, token, id);
      const calls = stored.filter(
        (e): e is StoredEvent & { args: Record<string, unknown> } =>
          'action' in e && e.action === 'tool_call',
      );
      expect(calls.map((c) => c.args)).toEqual([
        { tool: 'current_time', arguments: {}, tool_call_id: 'toolu_time_01' },
        { tool: 'files__echo', arguments: { text: 'from claude' }, tool_call_id: 'toolu_echo_02' },
      ]);
      for (const call of calls) {
        expect(call.cause).toBe(cause);
        const results = toolResultsOf(stored, call.args['tool_call_id']);
        expect(results, String(call.args['tool_call_id'])).toHaveLength(1);
        const [result] = results;
        expect(result!.cause).toBe(call.id);
        expect(result!.id).toBeGreaterThan(call.id);
        expect(result!.extras['is_error']).toBe(false);
        if (call.args['tool'] === 'files__echo') expect(result!.content).toBe('from claude');
        else expect(Date.parse(result!.content)).not.toBeNaN();
      }
      const answers = stored.filter((e) => isAgentReply(e, cause));
      expect(answers).toHaveLength(1);
      expect(answers[0]).toMatchObject({ args: { content: 'Both tools answered.' } });
      expect(answers[0]!.id).toBeGreaterThan(Math.max(...calls.map((c) => c.id)));

      // The second request carried both results back as tool_result blocks.
      const steps = model.streamed.filter((r) => tagged(r.body, 'tag-tools'));
      expect(steps).toHaveLength(2);
      const sent = toolResults(steps[1]!.body);
      expect(sent.map((b) => b.tool_use_id).sort()).toEqual(['toolu_echo_02', 'toolu_time_01']);
      expect(JSON.stringify(sent.find((b) => b.tool_use_id === 'toolu_echo_02'))).toContain(
        'from claude',
      );

      const metrics = await metricsOf(app.url, token, id);
      expect(metrics).toMatchObject({ prompt_tokens: 1200, completion_tokens: 80 });
      expect(metrics['cost_usd']).toBeCloseTo((1200 * 3 + 80 * 15) / 1e6, 9);
      expect(metrics['iterations']).toBe(2);
    } finally {
      client.close();
    }
  });

  it('titles an untitled conversation with one non-streamed Messages request', async () => {
    script('tag-title', {
      kind: 'stream',
      events: anthropicStream({
        text: ['an answer'],
        usage: { input_tokens: 10, output_tokens: 2 },
      }),
    });
    const { id, client } = await openConversation(app.url, token, { agent: 'llm' });
    try {
      const conversation = { baseUrl: app.url, token, id };
      const title = await sayAndReadTitle(client, 'tag-title: name this', conversation, 30_000);
      expect(title).toBe('Claude picked this title');
      const titleRequests = model.requests.filter((r) => !streaming(r.body));
      expect(titleRequests.some((r) => tagged(r.body, 'tag-title'))).toBe(true);
      // docs/protocol.md "Titles": the title request's usage counts in the metrics.
      expect(await metricsOf(app.url, token, id)).toMatchObject({
        prompt_tokens: 40,
        completion_tokens: 7,
      });
    } finally {
      client.close();
    }
  });

  it('never writes the Anthropic key to the logs', () => {
    const output = app.output();
    expect(output.length).toBeGreaterThan(0);
    expect(output).not.toContain(API_KEY);
  });
});
