export * from './agent-registry.js';
export * from './echo.agent.js';
