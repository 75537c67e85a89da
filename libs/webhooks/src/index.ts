export * from './webhook-backoff.js';
export * from './webhook-dispatcher.js';
export * from './webhook-hints.js';
export * from './webhook-request.js';
export * from './webhook-delivery.setup.js';
