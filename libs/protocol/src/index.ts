export * from './agent-state.js';
export * from './errors.js';
export * from './events.js';
export * from './limits.js';
export * from './replicas.js';
export * from './rest.js';
export * from './socket.js';
export * from './validation.js';
