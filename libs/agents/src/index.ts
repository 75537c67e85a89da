export * from './agent-registry.js';
export * from './echo.agent.js';
export * from './builtin-agents.js';
export * from './llm/llm.agent.js';
export * from './http/http.agent.js';
export * from './http/request-signature.js';
export * from './mcp/mcp-tools.js';
