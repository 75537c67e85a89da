import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { loadConfig } from '@cs/config';
import { FakeMcpServer } from '../../../test/fakes/fake-mcp-server.js';
import { createAgentRuntime, type AgentRuntime } from './agent-runtime.js';

let server: FakeMcpServer;
let runtime: AgentRuntime | undefined;

beforeEach(async () => {
  server = await FakeMcpServer.start();
});

afterEach(async () => {
  await runtime?.close();
  runtime = undefined;
  await server.close();
});

async function runtimeWith(env: Record<string, string>): Promise<AgentRuntime> {
  runtime = await createAgentRuntime(loadConfig('standalone', { ...env }));
  return runtime;
}

const call = (conversation_id: string) => ({
  signal: new AbortController().signal,
  idempotency_key: `${conversation_id}:call`,
  conversation_id,
});

describe('createAgentRuntime', () => {
  it("offers the MCP servers' tools, and ends a conversation's MCP session on the server when asked", async () => {
    const agents = await runtimeWith({
      MCP_SERVERS: JSON.stringify({ files: { url: server.url } }),
    });
    expect(agents.tools.has('files__echo')).toBe(true);
    const listed = server.sessionsOpened;

    const result = await agents.tools.run('files__echo', { text: 'hi' }, call('conv-1'));
    expect(result).toMatchObject({ content: 'hi', isError: false });
    await agents.tools.run('files__echo', { text: 'there' }, call('conv-2'));
    expect(server.sessionsOpened - listed).toBe(2);
    const closedBefore = server.sessionsClosed;

    await agents.endConversation('conv-1');
    expect(server.sessionsClosed - closedBefore).toBe(1);
    // The other conversation's session is untouched, and ending one twice does nothing.
    await agents.endConversation('conv-1');
    expect(server.sessionsClosed - closedBefore).toBe(1);
    expect(await agents.tools.run('files__echo', { text: 'still' }, call('conv-2'))).toMatchObject({
      content: 'still',
    });
    expect(server.sessionsOpened - listed).toBe(2);
  });

  it('ends a conversation without MCP servers, or after its server went away, without throwing', async () => {
    const none = await runtimeWith({});
    await expect(none.endConversation('conv-x')).resolves.toBeUndefined();
    await none.close();

    const agents = await runtimeWith({
      MCP_SERVERS: JSON.stringify({ files: { url: server.url } }),
    });
    await agents.tools.run('files__echo', { text: 'x' }, call('conv-3'));
    await server.close();
    await expect(agents.endConversation('conv-3')).resolves.toBeUndefined();
    server = await FakeMcpServer.start();
  });
});
