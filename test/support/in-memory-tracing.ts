// The OpenTelemetry SDK as tracing.sdk.ts starts it (context manager, W3C
// propagator), exporting to memory: for unit specs of what spans say.
import { context, propagation, trace } from '@opentelemetry/api';
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

/**
 * Starts the SDK before the tests of the file and shuts it down after them,
 * unregistering its globals: the next file of the same worker (the unit
 * project shares its workers between files) registers its own.
 */
export function useInMemoryTracing(): InMemoryTracing {
  const exporter = new InMemorySpanExporter();
  const processor = new SimpleSpanProcessor(exporter);
  const sdk = new NodeSDK({
    spanProcessors: [processor],
    instrumentations: [],
    resourceDetectors: [],
  });
  beforeAll(() => sdk.start());
  afterAll(async () => {
    await sdk.shutdown();
    trace.disable();
    context.disable();
    propagation.disable();
  });
  return {
    exporter,
    async finished() {
      await processor.forceFlush();
      return exporter.getFinishedSpans();
    },
  };
}
