/**
 * Tools of the MCP servers in `MCP_SERVERS` (docs/protocol.md "Tools"), through
 * `@modelcontextprotocol/sdk`'s client over the Streamable HTTP transport.
 * `loadMcpTools` lists every server's tools once (at process start: the
 * runtime's tool registry is the process's), each named `<server>__<tool>`,
 * idempotent only when its server lists it in `idempotent_tools`.
 *
 * Calls run in an MCP session of their conversation: one per conversation
 * and server, opened at its first call and ended by `endConversation` (when
 * the runtime lets the conversation go), after `MCP_SESSION_IDLE_MS` without
 * a call, or by `close()`. MCP servers keep state per session (a browser, a
 * working directory): conversations, and so tenants, never share one.
 * `run` calls the tool with `TOOL_TIMEOUT_MS` and the call's signal and
 * returns its text.
 *
 * Failures never crash anything: a server that is down when the tools are
 * listed contributes none (it is named in `unavailable`); a call to a server
 * that is down, a tool that answers an error, and a call that times out
 * throw an Error with a message safe to store (the runtime turns it into an
 * `is_error` result). A connection that failed is made again at the next
 * call. URLs and headers come from configuration only, redirects to another
 * origin are not followed, and neither ever appears in a message.
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult, Tool } from '@modelcontextprotocol/sdk/types.js';
import type { ToolDefinition } from '@cs/core';
import type { McpServerConfig } from '@cs/config';
import { cutText } from '@cs/protocol';
import { MODEL_TOOL_NAME } from '../llm/model-client.js';
import { loadMcpSdk, type McpSdk } from './mcp-sdk.js';

export const MCP_TOOL_SEPARATOR = '__';
/** A conversation's MCP session ends after this long without a call. */
export const MCP_SESSION_IDLE_MS = 10 * 60_000;
/** The most text one tool result returns; the rest is cut with a note. */
const MAX_RESULT_CHARS = 1_000_000;

export interface McpToolsOptions {
  /** `TOOL_TIMEOUT_MS`: one call, and connecting to and listing one server. */
  timeoutMs: number;
  /** Told about servers that are down and tools that cannot be offered (no URL, no header). */
  onWarning?: (message: string) => void;
  /** Default `MCP_SESSION_IDLE_MS`. */
  sessionIdleMs?: number;
}

export interface McpTools {
  tools: Record<string, ToolDefinition>;
  /** Servers whose tools could not be listed. */
  unavailable: string[];
  /** Ends the conversation's MCP sessions (the next call opens new ones). */
  endConversation(conversationId: string): Promise<void>;
  /** Ends every MCP session. */
  close(): Promise<void>;
}

export async function loadMcpTools(
  servers: Record<string, McpServerConfig>,
  options: McpToolsOptions,
): Promise<McpTools> {
  const configured = Object.entries(servers);
  // No server, no SDK: a process without MCP_SERVERS never loads it.
  const sdk = configured.length === 0 ? undefined : await loadMcpSdk();
  const sources = sdk
    ? configured.map(
        ([name, server]) =>
          new McpServerTools(
            sdk,
            name,
            server,
            options.timeoutMs,
            options.sessionIdleMs ?? MCP_SESSION_IDLE_MS,
          ),
      )
    : [];
  const listed = await Promise.all(
    sources.map(async (source) => {
      try {
        return await source.listTools();
      } catch (error) {
        options.onWarning?.(`${source.describeFailure(error)}: its tools are not offered`);
        return undefined;
      }
    }),
  );
  const tools: Record<string, ToolDefinition> = {};
  const unavailable: string[] = [];
  sources.forEach((source, index) => {
    const serverTools = listed[index];
    if (!serverTools) {
      unavailable.push(source.name);
      return;
    }
    // Tools whose names models accept as they are first: they keep them.
    const safeFirst = [...serverTools].sort(
      (a, b) => Number(!MODEL_TOOL_NAME.test(a.name)) - Number(!MODEL_TOOL_NAME.test(b.name)),
    );
    for (const tool of safeFirst) {
      // MCP allows names models refuse (`repos.list`): such characters become `_`.
      const name = `${source.name}${MCP_TOOL_SEPARATOR}${tool.name.replace(/[^A-Za-z0-9_-]/g, '_')}`;
      if (!MODEL_TOOL_NAME.test(name) || name in tools) {
        const why =
          name in tools ? 'is taken by another of its tools' : 'is one models do not accept';
        options.onWarning?.(
          `MCP tool ${JSON.stringify(`${source.name}${MCP_TOOL_SEPARATOR}${tool.name}`.slice(0, 200))}: its name ${why}; not offered`,
        );
        continue;
      }
      tools[name] = source.definition(name, tool);
    }
  });
  return {
    tools,
    unavailable,
    endConversation: async (id) => {
      await Promise.all(sources.map((source) => source.endConversation(id)));
    },
    close: async () => {
      await Promise.all(sources.map((source) => source.close()));
    },
  };
}

/** One server's tools, and the MCP session of each conversation that calls them. */
class McpServerTools {
  private readonly sessions = new Map<
    string,
    { connection: McpServerConnection; idle: NodeJS.Timeout }
  >();

  constructor(
    private readonly sdk: McpSdk,
    readonly name: string,
    private readonly server: McpServerConfig,
    private readonly timeoutMs: number,
    private readonly idleMs: number,
  ) {}

  /** Lists the tools in a session of its own, ended right after. */
  async listTools(): Promise<Tool[]> {
    const listing = new McpServerConnection(this.sdk, this.name, this.server, this.timeoutMs);
    try {
      return await listing.listTools();
    } finally {
      await listing.close();
    }
  }

  describeFailure(error: unknown): string {
    const { McpError, ErrorCode } = this.sdk;
    if (error instanceof McpError && error.code === (ErrorCode.RequestTimeout as number)) {
      return `MCP server ${this.name} did not answer within ${this.timeoutMs} ms`;
    }
    return `MCP server ${this.name} is unavailable`;
  }

  definition(name: string, tool: Tool): ToolDefinition {
    return {
      description: tool.description ?? tool.title ?? '',
      parameters: tool.inputSchema,
      idempotent: this.server.idempotent_tools?.includes(tool.name) ?? false,
      run: (args, context) =>
        this.sessionOf(context.conversation_id).call(
          name,
          tool.name,
          args,
          context.signal,
          context.idempotency_key,
        ),
    };
  }

  async endConversation(conversationId: string): Promise<void> {
    const session = this.sessions.get(conversationId);
    if (!session) return;
    this.sessions.delete(conversationId);
    clearTimeout(session.idle);
    await session.connection.close();
  }

  async close(): Promise<void> {
    await Promise.all([...this.sessions.keys()].map((id) => this.endConversation(id)));
  }

  private sessionOf(conversationId: string): McpServerConnection {
    const existing = this.sessions.get(conversationId);
    if (existing) clearTimeout(existing.idle);
    const connection =
      existing?.connection ??
      new McpServerConnection(this.sdk, this.name, this.server, this.timeoutMs);
    const idle = setTimeout(() => void this.endConversation(conversationId), this.idleMs).unref();
    this.sessions.set(conversationId, { connection, idle });
    return connection;
  }
}

/** One MCP session with one server: its client, made again after a failure. */
class McpServerConnection {
  private client: Promise<Client> | undefined;

  constructor(
    private readonly sdk: McpSdk,
    readonly name: string,
    private readonly server: McpServerConfig,
    private readonly timeoutMs: number,
  ) {}

  async listTools(): Promise<Tool[]> {
    const client = await this.connected();
    const tools: Tool[] = [];
    let cursor: string | undefined;
    do {
      const page = await client.listTools(cursor ? { cursor } : undefined, {
        timeout: this.timeoutMs,
      });
      tools.push(...page.tools);
      cursor = page.nextCursor;
    } while (cursor && tools.length < 10_000);
    return tools;
  }

  async close(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (!client) return;
    try {
      const ready = await client;
      const transport = ready.transport as StreamableHTTPClientTransport | undefined;
      // DELETE ends the server's session; a server that is gone does not hold us up.
      await Promise.race([
        transport?.terminateSession().catch(() => undefined),
        new Promise((resolve) => setTimeout(resolve, 1000).unref()),
      ]);
      await ready.close();
    } catch {
      // Never connected, or already gone: nothing to end.
    }
  }

  async call(
    name: string,
    tool: string,
    args: Record<string, unknown>,
    signal: AbortSignal,
    idempotencyKey: string,
  ): Promise<string> {
    let result: CallToolResult;
    try {
      const client = await this.connected();
      result = (await client.callTool(
        { name: tool, arguments: args, _meta: { idempotency_key: idempotencyKey } },
        undefined,
        { signal, timeout: this.timeoutMs },
      )) as CallToolResult;
    } catch (error) {
      if (signal.aborted)
        throw signal.reason instanceof Error ? signal.reason : new Error('aborted');
      const { McpError, ErrorCode } = this.sdk;
      if (error instanceof McpError) {
        if (error.code === (ErrorCode.RequestTimeout as number)) {
          throw new Error(`MCP tool ${name} timed out after ${this.timeoutMs} ms`, {
            // eslint-disable-next-line preserve-caught-error -- a redacted copy, see redacted()
            cause: this.redacted(error),
          });
        }
        // The server's own error (unknown tool, invalid arguments): the model may act on it.
        // A connection error also arrives as an McpError with code ConnectionClosed.
        if (error.code !== (ErrorCode.ConnectionClosed as number)) {
          throw new Error(`MCP tool ${name} failed: ${error.message.slice(0, 1000)}`, {
            // eslint-disable-next-line preserve-caught-error -- a redacted copy, see redacted()
            cause: this.redacted(error),
          });
        }
      }
      await this.reset();
      throw new Error(`MCP server ${this.name} is unavailable`, {
        // eslint-disable-next-line preserve-caught-error -- a redacted copy, see redacted()
        cause: this.redacted(error),
      });
    }
    const text = resultText(result);
    if (result.isError) throw new Error(text || `MCP tool ${name} failed`);
    return text;
  }

  private connected(): Promise<Client> {
    if (!this.client) {
      const connecting = this.connect();
      this.client = connecting;
      // A failed connection is made again at the next call.
      connecting.catch(() => {
        if (this.client === connecting) this.client = undefined;
      });
    }
    return this.client;
  }

  private async connect(): Promise<Client> {
    try {
      return await this.connectOnce();
    } catch (error) {
      // Opening a session is safe to repeat: once more, in case a pooled
      // connection had closed under us (a server that restarted).
      if (error instanceof this.sdk.McpError) throw error;
      return await this.connectOnce();
    }
  }

  private async connectOnce(): Promise<Client> {
    const client = new this.sdk.Client({ name: 'conversation-service', version: '1.0.0' });
    const transport = new this.sdk.StreamableHTTPClientTransport(new URL(this.server.url), {
      requestInit: { headers: this.server.headers ?? {} },
      redirectPolicy: 'same-origin',
    });
    try {
      await client.connect(transport, { timeout: this.timeoutMs });
    } catch (error) {
      await client.close().catch(() => undefined);
      throw error;
    }
    return client;
  }

  /**
   * The SDK's error for the logs, without the server's URL (it may carry a
   * token) or header values: the message of each error in its cause chain.
   */
  private redacted(error: unknown): Error {
    const secrets = [this.server.url, ...Object.values(this.server.headers ?? {})].filter(
      (secret) => secret.length >= 4,
    );
    const messages: string[] = [];
    for (let e: unknown = error; e instanceof Error && messages.length < 5; e = e.cause) {
      messages.push(`${e.name}: ${e.message}`);
    }
    let text = messages.join(' ← ') || String(error);
    for (const secret of secrets) text = text.split(secret).join('***');
    return new Error(text.slice(0, 2000));
  }

  private async reset(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    await client?.then((c) => c.close()).catch(() => undefined);
  }
}

/** A call's result as text: its text parts, resources' text, a note for other media. */
export function resultText(result: CallToolResult): string {
  const parts: string[] = [];
  for (const item of result.content ?? []) {
    if (item.type === 'text') parts.push(item.text);
    else if (item.type === 'resource' && 'text' in item.resource) parts.push(item.resource.text);
    else if (item.type === 'resource_link') parts.push(`[resource ${item.uri}]`);
    else parts.push(`[${item.type}${'mimeType' in item ? ` ${String(item.mimeType)}` : ''}]`);
  }
  if (parts.length === 0 && result.structuredContent !== undefined) {
    parts.push(JSON.stringify(result.structuredContent));
  }
  const text = parts.join('\n');
  return text.length > MAX_RESULT_CHARS
    ? `${cutText(text, MAX_RESULT_CHARS)} […cut at ${MAX_RESULT_CHARS} characters]`
    : text;
}
