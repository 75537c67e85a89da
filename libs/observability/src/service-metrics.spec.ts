import { describe, expect, it } from 'vitest';
import { ServiceMetrics } from './service-metrics.js';

async function value(metrics: ServiceMetrics, name: string, labels: Record<string, string> = {}) {
  const metric = (await metrics.registry.getMetricsAsJSON()).find((m) => m.name === name);
  const sample = metric?.values.find((v) =>
    Object.entries(labels).every(([key, wanted]) => v.labels[key] === wanted),
  );
  return sample?.value;
}

describe(ServiceMetrics.name, () => {
  it('counts what the runtime and the cluster report', async () => {
    const metrics = new ServiceMetrics({ role: 'worker' });
    const runtime = metrics.runtime();
    const cluster = metrics.cluster();
    runtime.stepFinished(0.2);
    runtime.toolCalled('search', 'ok');
    runtime.toolCalled('search', 'timeout');
    runtime.tokensUsed(120, 30);
    runtime.llmRequest(1.5);
    cluster.leaseAcquired();
    cluster.failover();
    cluster.handoff();
    cluster.wakeupPickedUp(-0.01); // clocks of two hosts: never negative
    cluster.limitEviction();
    cluster.limitRejection();
    cluster.limitRejection();

    expect(await value(metrics, 'cs_tool_calls_total', { tool: 'search', outcome: 'ok' })).toBe(1);
    expect(await value(metrics, 'cs_tool_calls_total', { outcome: 'timeout' })).toBe(1);
    expect(await value(metrics, 'cs_llm_tokens_total', { kind: 'prompt' })).toBe(120);
    expect(await value(metrics, 'cs_llm_tokens_total', { kind: 'completion' })).toBe(30);
    for (const name of ['cs_lease_acquisitions_total', 'cs_failovers_total', 'cs_handoffs_total'])
      expect(await value(metrics, name), name).toBe(1);
    expect(await value(metrics, 'cs_limit_evictions_total')).toBe(1);
    expect(await value(metrics, 'cs_limit_rejections_total')).toBe(2);
    const text = await metrics.registry.metrics();
    expect(text).toMatch(/cs_agent_step_seconds_count\{role="worker"\} 1/);
    expect(text).toMatch(/cs_llm_request_seconds_sum\{role="worker"\} 1.5/);
    expect(text).toMatch(/cs_wakeup_pickup_seconds_sum\{role="worker"\} 0\n/);
  });

  it('reads the waiting conversations at scrape time, and keeps the last value when the source hangs', async () => {
    const metrics = new ServiceMetrics();
    let waiting: () => Promise<number> = () => Promise.resolve(4);
    metrics.setWaitingConversationsSource(() => waiting());
    expect(await value(metrics, 'cs_conversations_waiting')).toBe(4);
    waiting = () => new Promise(() => undefined); // Redis that never answers
    const started = Date.now();
    expect(await value(metrics, 'cs_conversations_waiting')).toBe(4);
    expect(Date.now() - started).toBeLessThan(3_000);
    waiting = () => Promise.reject(new Error('down'));
    expect(await value(metrics, 'cs_conversations_waiting')).toBe(4);
  });

  it('reports the waiting conversations of several queues as their sum, and each queue by its index', async () => {
    const metrics = new ServiceMetrics({ role: 'gateway' });
    metrics.setWaitingConversationsSource(() => Promise.resolve([3, 0, 2, 1]));
    const text = await metrics.registry.metrics();
    expect(text).toContain('cs_conversations_waiting{role="gateway"} 6\n');
    expect(text).toContain('cs_conversations_waiting{queue="0",role="gateway"} 3\n');
    expect(text).toContain('cs_conversations_waiting{queue="1",role="gateway"} 0\n');
    expect(text).toContain('cs_conversations_waiting{queue="2",role="gateway"} 2\n');
    expect(text).toContain('cs_conversations_waiting{queue="3",role="gateway"} 1\n');
  });
});
