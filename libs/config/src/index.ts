export * from './config.js';
export { CONFIG_VARIABLES, type Env, type LlmPrices, type McpServerConfig } from './env.schema.js';
export * from './startup-error.js';
