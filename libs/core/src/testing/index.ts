/** Test doubles for domain unit tests. Not exported from `@cs/core`'s main entry. */
export * from './manual-clock.js';
export * from './recording-broadcaster.js';
export * from './test-agents.js';
