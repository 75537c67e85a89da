import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { AppendOptions, AppendedEvent, ConversationStore, EventDraft } from '@cs/core';

/**
 * The process's Prometheus metrics, on a registry of its own (several apps
 * may share one test process). Sources of gauges are set by the host app.
 */
export class ServiceMetrics {
  readonly registry = new Registry();
  readonly socketsConnected: Gauge;
  readonly eventStreamsOpen: Gauge;
  readonly runningConversations: Gauge;
  readonly appendSeconds: Histogram;
  readonly userActions: Counter;
  private runningSource: () => number | Promise<number> = () => 0;

  constructor(labels: Record<string, string> = {}) {
    this.registry.setDefaultLabels(labels);
    collectDefaultMetrics({ register: this.registry, prefix: 'cs_' });
    this.socketsConnected = new Gauge({
      name: 'cs_connected_sockets',
      help: 'Socket.IO connections attached to a conversation on this process',
      registers: [this.registry],
    });
    this.eventStreamsOpen = new Gauge({
      name: 'cs_open_event_streams',
      help: 'Server-Sent Event streams of a conversation open on this process',
      registers: [this.registry],
    });
    const source = () => this.runningSource();
    this.runningConversations = new Gauge({
      name: 'cs_running_conversations',
      help: 'Conversations whose agent runs on this process',
      registers: [this.registry],
      async collect() {
        this.set(await source());
      },
    });
    this.appendSeconds = new Histogram({
      name: 'cs_event_append_seconds',
      help: 'Latency of appending events to the event store',
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      labelNames: ['writer'],
      registers: [this.registry],
    });
    this.userActions = new Counter({
      name: 'cs_user_actions_total',
      help: 'User actions stored',
      registers: [this.registry],
    });
  }

  setRunningConversationsSource(source: () => number | Promise<number>): void {
    this.runningSource = source;
  }

  /** Wraps a store so that every append is timed. */
  instrument(store: ConversationStore): ConversationStore {
    const histogram = this.appendSeconds;
    return new Proxy(store, {
      get(target, property, receiver) {
        if (property !== 'append') {
          const value = Reflect.get(target, property, receiver) as unknown;
          // Methods run on the store itself, so that its private state is reachable.
          return typeof value === 'function'
            ? (value as (...args: unknown[]) => unknown).bind(target)
            : value;
        }
        return async (
          tenantId: string,
          conversationId: string,
          drafts: readonly EventDraft[],
          options?: AppendOptions,
        ): Promise<AppendedEvent[]> => {
          const end = histogram.startTimer({
            writer: options?.leaseEpoch === undefined ? 'user' : 'agent',
          });
          try {
            return await target.append(tenantId, conversationId, drafts, options);
          } finally {
            end();
          }
        };
      },
    });
  }
}
