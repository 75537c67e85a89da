export * from './service-metrics.js';
