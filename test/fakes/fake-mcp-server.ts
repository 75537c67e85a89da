/**
 * A real MCP server for tests, made with `@modelcontextprotocol/sdk`'s server
 * side (McpServer over StreamableHTTPServerTransport, one per session) on
 * node:http. It requires `authorization: Bearer <token>` when given one, and
 * offers: `echo` { text } → the text; `add` { a, b } → the sum; `fail` → an
 * `isError` result; `explode` → a handler that throws; `slow` { ms } → waits,
 * then "done". It records the `_meta` of each call and counts sessions.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

export class FakeMcpServer {
  readonly metas: Record<string, unknown>[] = [];
  /** Sessions opened and closed (DELETE) so far. */
  sessionsOpened = 0;
  sessionsClosed = 0;
  private readonly transports = new Map<string, StreamableHTTPServerTransport>();
  private readonly server: Server;

  private constructor(private readonly token: string | undefined) {
    this.server = createServer((req, res) => {
      void this.handle(req, res).catch(() => {
        if (!res.headersSent) res.writeHead(500).end();
      });
    });
  }

  static async start(options: { token?: string; port?: number } = {}): Promise<FakeMcpServer> {
    const fake = new FakeMcpServer(options.token);
    await new Promise<void>((resolve) =>
      fake.server.listen(options.port ?? 0, '127.0.0.1', resolve),
    );
    return fake;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  async close(): Promise<void> {
    for (const transport of this.transports.values()) await transport.close();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async handle(
    req: IncomingMessage,
    res: import('node:http').ServerResponse,
  ): Promise<void> {
    if (this.token && req.headers.authorization !== `Bearer ${this.token}`) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"unauthorized"}');
      return;
    }
    let body: unknown;
    if (req.method === 'POST') {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    }
    const sessionId = req.headers['mcp-session-id'];
    let transport = typeof sessionId === 'string' ? this.transports.get(sessionId) : undefined;
    if (!transport) {
      if (req.method !== 'POST' || !isInitializeRequest(body)) {
        res.writeHead(404, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            jsonrpc: '2.0',
            error: { code: -32001, message: 'Session not found' },
            id: null,
          }),
        );
        return;
      }
      const created: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          this.sessionsOpened += 1;
          this.transports.set(id, created);
        },
        onsessionclosed: (id) => {
          this.sessionsClosed += 1;
          this.transports.delete(id);
        },
      });
      await this.mcpServer().connect(created);
      transport = created;
    }
    await transport.handleRequest(req, res, body);
  }

  private mcpServer(): McpServer {
    const server = new McpServer({ name: 'fake-mcp', version: '1.0.0' });
    const remember = (meta: unknown) => this.metas.push((meta ?? {}) as Record<string, unknown>);
    server.registerTool(
      'echo',
      { description: 'Repeats the text', inputSchema: { text: z.string() } },
      ({ text }, extra) => {
        remember(extra._meta);
        return { content: [{ type: 'text', text }] };
      },
    );
    server.registerTool(
      'add',
      { description: 'Adds two numbers', inputSchema: { a: z.number(), b: z.number() } },
      ({ a, b }) => ({ content: [{ type: 'text', text: String(a + b) }] }),
    );
    // Names MCP allows and models do not: with a dot (`issues.list` is offered as
    // `issues_list`; `labels.list` would take the name of `labels_list`), and one too
    // long once prefixed.
    for (const name of ['issues.list', 'labels.list', 'labels_list', 'x'.repeat(64)]) {
      server.registerTool(name, { description: `Answers ${name}` }, () => ({
        content: [{ type: 'text', text: `${name} answered` }],
      }));
    }
    server.registerTool('fail', { description: 'Always fails' }, () => ({
      isError: true,
      content: [{ type: 'text', text: 'the disk is full' }],
    }));
    server.registerTool('explode', { description: 'Throws' }, () => {
      throw new Error('kaboom inside the tool');
    });
    server.registerTool(
      'slow',
      { description: 'Waits', inputSchema: { ms: z.number() } },
      async ({ ms }) => {
        await new Promise((resolve) => setTimeout(resolve, ms));
        return { content: [{ type: 'text', text: 'done' }] };
      },
    );
    return server;
  }
}
