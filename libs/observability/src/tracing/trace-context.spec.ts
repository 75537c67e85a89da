import { describe, expect, it } from 'vitest';
import { useInMemoryTracing } from '../../../../test/support/in-memory-tracing.js';
import { continueTrace, currentTraceparent, withRemoteParent, withSpan } from './trace-context.js';

// The SDK as tracing.sdk.ts starts it (context manager, W3C propagator), exporting in memory.
const { exporter, finished } = useInMemoryTracing();

describe('trace context across processes', () => {
  it('continues the trace of a traceparent: the sender, then the holder, then its steps', async () => {
    exporter.reset();
    let sent: string | undefined;
    await withSpan('POST /api/conversations/:id/events', () => {
      sent = currentTraceparent();
      return Promise.resolve();
    });
    expect(sent).toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);

    await withRemoteParent(sent, 'agent turn', () =>
      withSpan('agent step', () => Promise.resolve(), { 'cs.step': 1 }),
    );
    continueTrace(sent!, 'conversation wake-up', () => undefined);

    const spans = await finished();
    const byName = new Map(spans.map((span) => [span.name, span]));
    const sender = byName.get('POST /api/conversations/:id/events')!;
    const turn = byName.get('agent turn')!;
    const step = byName.get('agent step')!;
    const wake = byName.get('conversation wake-up')!;
    for (const span of [turn, step, wake])
      expect(span.spanContext().traceId).toBe(sender.spanContext().traceId);
    expect(turn.parentSpanContext?.spanId).toBe(sender.spanContext().spanId);
    expect(wake.parentSpanContext?.spanId).toBe(sender.spanContext().spanId);
    expect(step.parentSpanContext?.spanId).toBe(turn.spanContext().spanId);
  });

  it('marks a span that threw as an error and rethrows', async () => {
    exporter.reset();
    await expect(
      withRemoteParent(undefined, 'failing turn', () => Promise.reject(new Error('boom'))),
    ).rejects.toThrow('boom');
    const [span] = await finished();
    expect(span?.status.code).toBe(2); // SpanStatusCode.ERROR
  });

  it('has no traceparent outside a span', () => {
    expect(currentTraceparent()).toBeUndefined();
  });
});
