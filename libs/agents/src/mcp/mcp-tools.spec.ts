import { createServer } from 'node:net';
import { inspect } from 'node:util';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { FakeMcpServer } from '../../../../test/fakes/fake-mcp-server.js';
import { MODEL_TOOL_NAME } from '../llm/model-client.js';
import { loadMcpTools, resultText, type McpTools } from './mcp-tools.js';

const TOKEN = 'mcp-header-token-0123456789';
let server: FakeMcpServer;
let loaded: McpTools | undefined;

beforeEach(async () => {
  server = await FakeMcpServer.start({ token: TOKEN });
});

afterEach(async () => {
  await loaded?.close();
  loaded = undefined;
  await server.close();
});

const run = (signal = new AbortController().signal) => ({
  signal,
  idempotency_key: 'call-key-1',
  conversation_id: 'conv-mcp',
});

async function load(
  servers: Parameters<typeof loadMcpTools>[0],
  timeoutMs = 2000,
  warnings: string[] = [],
) {
  loaded = await loadMcpTools(servers, { timeoutMs, onWarning: (w) => warnings.push(w) });
  return loaded;
}

/** A local port nothing listens on. */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const { port } = probe.address() as { port: number };
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

describe('loadMcpTools', () => {
  it('lists the tools as <server>__<tool> with their schemas, idempotent as configured', async () => {
    const { tools, unavailable } = await load({
      files: {
        url: server.url,
        headers: { authorization: `Bearer ${TOKEN}` },
        idempotent_tools: ['echo'],
      },
    });
    expect(unavailable).toEqual([]);
    expect(Object.keys(tools).sort()).toEqual([
      'files__add',
      'files__echo',
      'files__explode',
      'files__fail',
      'files__issues_list',
      'files__labels_list',
      'files__slow',
    ]);
    const echo = tools['files__echo']!;
    expect(echo.description).toBe('Repeats the text');
    expect(echo.idempotent).toBe(true);
    expect(tools['files__add']!.idempotent).toBe(false);
    expect(echo.parameters).toMatchObject({
      type: 'object',
      properties: { text: { type: 'string' } },
      required: ['text'],
    });
  });

  it('offers a tool whose name models refuse under a name they accept, unless that name is taken or too long', async () => {
    const warnings: string[] = [];
    const { tools } = await loadMcpTools(
      { files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } } },
      { timeoutMs: 2000, onWarning: (warning) => warnings.push(warning) },
    );
    // Called by its own name on the server.
    expect(await tools['files__issues_list']!.run({}, run())).toBe('issues.list answered');
    // `labels_list` keeps its name; `labels.list` would take it, and is not offered.
    expect(await tools['files__labels_list']!.run({}, run())).toBe('labels_list answered');
    expect(warnings.sort()).toEqual([
      'MCP tool "files__labels.list": its name is taken by another of its tools; not offered',
      `MCP tool "files__${'x'.repeat(64)}": its name is one models do not accept; not offered`,
    ]);
    for (const name of Object.keys(tools)) expect(name).toMatch(MODEL_TOOL_NAME);
  });

  it('calls a tool and returns its text, passing the idempotency key in _meta', async () => {
    const { tools } = await load({
      files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
    });
    expect(await tools['files__echo']!.run({ text: 'héllo' }, run())).toBe('héllo');
    expect(await tools['files__add']!.run({ a: 2, b: 40 }, run())).toBe('42');
    expect(server.metas).toEqual([{ idempotency_key: 'call-key-1' }]);
  });

  it('throws for a tool that answers an error, one that throws, and bad arguments', async () => {
    const { tools } = await load({
      files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
    });
    await expect(tools['files__fail']!.run({}, run())).rejects.toThrow('the disk is full');
    await expect(tools['files__explode']!.run({}, run())).rejects.toThrow('kaboom inside the tool');
    await expect(tools['files__add']!.run({ a: 'x' }, run())).rejects.toThrow();
    // The session goes on.
    expect(await tools['files__echo']!.run({ text: 'still' }, run())).toBe('still');
  });

  it('throws when a call outlasts TOOL_TIMEOUT_MS', async () => {
    const { tools } = await load(
      { files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } } },
      300,
    );
    const started = Date.now();
    await expect(tools['files__slow']!.run({ ms: 5000 }, run())).rejects.toThrow(
      'MCP tool files__slow timed out after 300 ms',
    );
    expect(Date.now() - started).toBeLessThan(2000);
  });

  it('offers no tools of a server that is down or refuses the headers, and says so without its URL or headers', async () => {
    const port = await closedPort();
    const warnings: string[] = [];
    const { tools, unavailable } = await load(
      {
        down: { url: `http://127.0.0.1:${port}/mcp` },
        locked: { url: server.url, headers: { authorization: 'Bearer wrong-token-abcdef' } },
        files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
      },
      2000,
      warnings,
    );
    expect(unavailable.sort()).toEqual(['down', 'locked']);
    expect(Object.keys(tools).every((name) => name.startsWith('files__'))).toBe(true);
    // One for each server left out (the others name tools of `files` that are not offered).
    expect(warnings.filter((w) => !w.startsWith('MCP tool '))).toHaveLength(2);
    const said = warnings.join('\n');
    expect(said).not.toContain(String(port));
    expect(said).not.toContain('wrong-token');
    expect(said).not.toContain(TOKEN);
  });

  it('throws a safe error when the server goes down after listing, and works again once it is back', async () => {
    const { tools } = await load({
      files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
    });
    const port = server.port;
    const url = server.url;
    await server.close();
    const error = (await Promise.resolve(tools['files__echo']!.run({ text: 'x' }, run())).then(
      () => undefined,
      (e: unknown) => e,
    )) as Error;
    expect(error).toBeInstanceOf(Error);
    expect(error.message).toBe('MCP server files is unavailable');
    expect(inspect(error, { depth: 20 })).not.toContain(TOKEN);
    expect(inspect(error, { depth: 20 })).not.toContain(url);

    server = await FakeMcpServer.start({ token: TOKEN, port });
    expect(await tools['files__echo']!.run({ text: 'back' }, run())).toBe('back');
  });

  it('stops a call when its signal aborts', async () => {
    const { tools } = await load({
      files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
    });
    const controller = new AbortController();
    const call = tools['files__slow']!.run({ ms: 5000 }, run(controller.signal));
    setTimeout(() => controller.abort(new Error('turn stopped')), 50);
    const started = Date.now();
    await expect(call).rejects.toThrow('turn stopped');
    expect(Date.now() - started).toBeLessThan(1000);
  });

  it('lists in a session of its own, calls in one session per conversation, and ends them', async () => {
    const mcp = await load({
      files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } },
    });
    expect([server.sessionsOpened, server.sessionsClosed]).toEqual([1, 1]);
    const inA = { ...run(), conversation_id: 'conv-a' };
    const inB = { ...run(), conversation_id: 'conv-b' };
    await mcp.tools['files__echo']!.run({ text: '1' }, inA);
    await mcp.tools['files__echo']!.run({ text: '2' }, inA);
    await mcp.tools['files__echo']!.run({ text: '3' }, inB);
    expect([server.sessionsOpened, server.sessionsClosed]).toEqual([3, 1]);
    await mcp.endConversation('conv-a');
    expect(server.sessionsClosed).toBe(2);
    await mcp.tools['files__echo']!.run({ text: '4' }, inA);
    expect(server.sessionsOpened).toBe(4);
    await mcp.close();
    loaded = undefined;
    expect(server.sessionsClosed).toBe(4);
  });

  it("ends a conversation's session after it has been idle", async () => {
    loaded = await loadMcpTools(
      { files: { url: server.url, headers: { authorization: `Bearer ${TOKEN}` } } },
      // Long enough that a busy machine does not pass it between the call and the first check.
      { timeoutMs: 2000, sessionIdleMs: 1000 },
    );
    await loaded.tools['files__echo']!.run({ text: 'x' }, run());
    expect(server.sessionsOpened - server.sessionsClosed).toBe(1);
    await vi.waitFor(() => expect(server.sessionsOpened - server.sessionsClosed).toBe(0), {
      timeout: 10_000,
      interval: 50,
    });
  });
});

describe('resultText', () => {
  it('joins text parts, resource text and notes for other media, or the structured content', () => {
    expect(
      resultText({
        content: [
          { type: 'text', text: 'a' },
          { type: 'image', data: 'AAAA', mimeType: 'image/png' },
          { type: 'resource', resource: { uri: 'file:///x', text: 'b' } },
        ],
      }),
    ).toBe('a\n[image image/png]\nb');
    expect(resultText({ content: [], structuredContent: { n: 1 } })).toBe('{"n":1}');
  });
});
