export * from './logging/service-logger.js';
export * from './service-metrics.js';
export * from './tracing/trace-context.js';
export { stopTracing } from './tracing/tracing-shutdown.js';
export * from './readiness.js';
