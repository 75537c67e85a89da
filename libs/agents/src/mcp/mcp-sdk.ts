/**
 * The MCP SDK's client side, imported when a process first talks to an MCP
 * server: a process without `MCP_SERVERS` never loads it (about 7 MB of heap
 * in every gateway and worker otherwise).
 */
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js';

export interface McpSdk {
  Client: typeof Client;
  StreamableHTTPClientTransport: typeof StreamableHTTPClientTransport;
  McpError: typeof McpError;
  ErrorCode: typeof ErrorCode;
}

let loading: Promise<McpSdk> | undefined;

export function loadMcpSdk(): Promise<McpSdk> {
  loading ??= Promise.all([
    import('@modelcontextprotocol/sdk/client/index.js'),
    import('@modelcontextprotocol/sdk/client/streamableHttp.js'),
    import('@modelcontextprotocol/sdk/types.js'),
  ]).then(([client, transport, types]) => ({
    Client: client.Client,
    StreamableHTTPClientTransport: transport.StreamableHTTPClientTransport,
    McpError: types.McpError,
    ErrorCode: types.ErrorCode,
  }));
  return loading;
}
