export * from './agent.js';
export * from './conversation.js';
export * from './conversation-manager.js';
export * from './errors.js';
export * from './state.js';
export * from './ports/broadcaster.port.js';
export * from './ports/clock.port.js';
export * from './ports/conversation-store.port.js';
