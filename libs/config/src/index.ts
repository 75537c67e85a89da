export * from './config.js';
export * from './startup-error.js';
