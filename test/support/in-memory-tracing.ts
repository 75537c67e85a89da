// The OpenTelemetry SDK as tracing.sdk.ts starts it (context manager, W3C
// propagator), exporting to memory: for unit specs of what spans say.
import { NodeSDK } from '@opentelemetry/sdk-node';
import {
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll } from 'vitest';

export interface InMemoryTracing {
  exporter: InMemorySpanExporter;
  /** The spans ended so far (the processor exports them asynchronously). */
  finished(): Promise<ReadableSpan[]>;
}

/** Starts the SDK before the tests of the file and shuts it down after them. */
export function useInMemoryTracing(): InMemoryTracing {
  const exporter = new InMemorySpanExporter();
  const processor = new SimpleSpanProcessor(exporter);
  const sdk = new NodeSDK({
    spanProcessors: [processor],
    instrumentations: [],
    resourceDetectors: [],
  });
  beforeAll(() => sdk.start());
  afterAll(() => sdk.shutdown());
  return {
    exporter,
    async finished() {
      await processor.forceFlush();
      return exporter.getFinishedSpans();
    },
  };
}
