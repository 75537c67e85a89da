import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { AppendOptions, AppendedEvent, ConversationStore, EventDraft } from '@cs/core';

/** Outcomes of a tool call (`cs_tool_calls_total{outcome}`). */
export type ToolCallOutcome =
  'ok' | 'error' | 'rejected' | 'in_doubt' | 'timeout' | 'cancelled' | 'not_run';

/**
 * The agent runtime's metrics: the methods of `RuntimeMetrics` of libs/core
 * (ports/runtime-metrics.port.ts), and the model request's latency, which the
 * `llm` agent observes.
 */
export interface AgentRuntimeMetrics {
  /** One agent step ran (`cs_agent_step_seconds`). */
  stepFinished(seconds: number): void;
  /** One tool call ended (`cs_tool_calls_total{tool,outcome}`). */
  toolCalled(tool: string, outcome: ToolCallOutcome): void;
  /** Tokens a model request used (`cs_llm_tokens_total{kind}`). */
  tokensUsed(prompt: number, completion: number): void;
  /** One model request ended, its stream included (`cs_llm_request_seconds`). */
  llmRequest(seconds: number): void;
}

/**
 * What the managers and the worker host report: the same methods as
 * `ClusterMetrics` of libs/core (ports/cluster-metrics.port.ts).
 */
export interface ClusterMetricsRecorder {
  leaseAcquired(): void;
  failover(): void;
  handoff(): void;
  wakeupPickedUp(seconds: number): void;
  limitEviction(): void;
  reconciled(): void;
  limitRejection(): void;
}

/** Conversations waiting for a worker: in all, or in each queue by index. */
export type WaitingConversations = number | readonly number[];

/** A scrape never waits longer than this for Redis (`cs_conversations_waiting`). */
const SOURCE_TIMEOUT_MS = 1_000;
/** Latencies from a millisecond to a few minutes (steps, model requests). */
const SLOW_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

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
  /** Conversations deleted by retention (docs/protocol.md "Data lifecycle"). */
  readonly retentionDeleted: Counter;
  readonly leaseAcquisitions: Counter;
  readonly failovers: Counter;
  readonly handoffs: Counter;
  readonly agentStepSeconds: Histogram;
  readonly wakeupPickupSeconds: Histogram;
  readonly conversationsWaiting: Gauge;
  readonly limitEvictions: Counter;
  readonly limitRejections: Counter;
  readonly conversationsReconciled: Counter;
  readonly llmRequestSeconds: Histogram;
  readonly llmTokens: Counter<'kind'>;
  readonly toolCalls: Counter<'tool' | 'outcome'>;
  readonly restTurnWaits: Gauge;
  readonly budgetRejections: Counter<'scope'>;
  readonly webhookDeliveries: Counter<'outcome'>;
  readonly webhookPending: Gauge;
  private pendingWebhooksSource: () => number | Promise<number> = () => 0;
  private runningSource: () => number | Promise<number> = () => 0;
  private waitingSource: () => WaitingConversations | Promise<WaitingConversations> = () => 0;

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
      help: 'User actions stored (socket and REST; a create with its initial_user_msg and replayed events), as RATE_LIMIT_PER_MINUTE counts them: no idempotent repeat, no refused action',
      registers: [this.registry],
    });
    const counter = (name: string, help: string) =>
      new Counter({ name, help, registers: [this.registry] });
    this.retentionDeleted = counter(
      'cs_retention_deleted_total',
      'Conversations deleted by retention (idle for RETENTION_DAYS) by this process',
    );
    this.leaseAcquisitions = counter(
      'cs_lease_acquisitions_total',
      'Conversation leases taken by this process',
    );
    this.failovers = counter(
      'cs_failovers_total',
      'Leases taken over from a holder that crashed or lost them',
    );
    this.handoffs = counter('cs_handoffs_total', 'Leases handed back to the queue while draining');
    this.limitEvictions = counter(
      'cs_limit_evictions_total',
      'Conversations stopped to make room for a newer one of their user (evict_oldest)',
    );
    this.limitRejections = counter(
      'cs_limit_rejections_total',
      'Starts refused because the user runs too many conversations (reject)',
    );
    this.conversationsReconciled = counter(
      'cs_conversations_reconciled_total',
      'Live conversations (STARTING or RUNNING in Postgres) started again because Redis had lost their job',
    );
    this.agentStepSeconds = new Histogram({
      name: 'cs_agent_step_seconds',
      help: 'Duration of one agent step (model call, streaming, storing its outputs)',
      buckets: SLOW_BUCKETS,
      registers: [this.registry],
    });
    this.wakeupPickupSeconds = new Histogram({
      name: 'cs_wakeup_pickup_seconds',
      help: 'From a wake-up sent (user event stored, job added) to its holder picking it up',
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [this.registry],
    });
    this.llmRequestSeconds = new Histogram({
      name: 'cs_llm_request_seconds',
      help: 'Duration of one model request, its stream included',
      buckets: SLOW_BUCKETS,
      registers: [this.registry],
    });
    this.llmTokens = new Counter({
      name: 'cs_llm_tokens_total',
      help: 'Tokens of model requests, by kind (prompt, completion)',
      labelNames: ['kind'],
      registers: [this.registry],
    });
    // Both kinds from the start, so that rates of a process that made no request read 0.
    for (const kind of ['prompt', 'completion']) this.llmTokens.inc({ kind }, 0);
    this.toolCalls = new Counter({
      name: 'cs_tool_calls_total',
      help: 'Tool calls ended, by tool and outcome (ok, error, rejected, in_doubt, timeout, cancelled, not_run)',
      labelNames: ['tool', 'outcome'],
      registers: [this.registry],
    });
    this.restTurnWaits = new Gauge({
      name: 'cs_rest_turn_waits',
      help: 'REST requests waiting for their turn (Prefer: wait) on this process',
      registers: [this.registry],
    });
    this.budgetRejections = new Counter({
      name: 'cs_budget_rejections_total',
      help: 'Model requests not sent because their worst case did not fit a budget, by scope (user, tenant)',
      labelNames: ['scope'],
      registers: [this.registry],
    });
    this.webhookDeliveries = new Counter({
      name: 'cs_webhook_deliveries_total',
      help: 'Webhook delivery attempts by outcome: delivered, retried (failed, to be tried again), failed (attempts spent)',
      labelNames: ['outcome'],
      registers: [this.registry],
    });
    const pendingWebhooks = () => this.pendingWebhooksSource();
    this.webhookPending = new Gauge({
      name: 'cs_webhook_pending',
      help: 'Webhook deliveries of the deployment not yet delivered nor failed (read from the outbox)',
      registers: [this.registry],
      async collect() {
        const value = await withTimeout(Promise.resolve().then(pendingWebhooks), SOURCE_TIMEOUT_MS);
        if (value !== undefined) this.set(value);
      },
    });
    const waiting = () => this.waitingSource();
    this.conversationsWaiting = new Gauge({
      name: 'cs_conversations_waiting',
      help: 'Conversations waiting for a worker (queued jobs: waiting, delayed, prioritized): the sum over the queues without a queue label, and each queue with its index as queue',
      labelNames: ['queue'],
      registers: [this.registry],
      async collect() {
        // A dependency that does not answer leaves the last value: the scrape still answers.
        const value = await withTimeout(Promise.resolve().then(waiting), SOURCE_TIMEOUT_MS);
        if (value === undefined) return;
        if (typeof value === 'number') {
          this.set(value);
          return;
        }
        this.set(value.reduce((sum, count) => sum + count, 0));
        value.forEach((count, index) => this.set({ queue: String(index) }, count));
      },
    });
  }

  setRunningConversationsSource(source: () => number | Promise<number>): void {
    this.runningSource = source;
  }

  /** Where `cs_webhook_pending` is read at scrape time (the outbox); 0 when unset. */
  setPendingWebhooksSource(source: () => number | Promise<number>): void {
    this.pendingWebhooksSource = source;
  }

  /** `WebhookDispatcher`'s `onOutcome`. */
  webhookOutcome(outcome: 'delivered' | 'retried' | 'failed'): void {
    this.webhookDeliveries.inc({ outcome });
  }

  /**
   * Where `cs_conversations_waiting` is read at scrape time (the BullMQ
   * queues' counts, by queue index: `ConversationJobs.waitingCounts`); 0 when
   * unset (standalone).
   */
  setWaitingConversationsSource(
    source: () => WaitingConversations | Promise<WaitingConversations>,
  ): void {
    this.waitingSource = source;
  }

  /** The agent runtime's port (`RuntimeMetrics` of libs/core), for the AgentSession. */
  runtime(): AgentRuntimeMetrics {
    return {
      stepFinished: (seconds) => this.agentStepSeconds.observe(nonNegative(seconds)),
      toolCalled: (tool, outcome) => this.toolCalls.inc({ tool, outcome }),
      tokensUsed: (prompt, completion) => {
        if (prompt > 0) this.llmTokens.inc({ kind: 'prompt' }, prompt);
        if (completion > 0) this.llmTokens.inc({ kind: 'completion' }, completion);
      },
      llmRequest: (seconds) => this.llmRequestSeconds.observe(nonNegative(seconds)),
    };
  }

  /** The managers' and the worker host's port (`ClusterMetrics` of libs/core). */
  cluster(): ClusterMetricsRecorder {
    return {
      leaseAcquired: () => this.leaseAcquisitions.inc(),
      failover: () => this.failovers.inc(),
      handoff: () => this.handoffs.inc(),
      wakeupPickedUp: (seconds) => this.wakeupPickupSeconds.observe(nonNegative(seconds)),
      limitEviction: () => this.limitEvictions.inc(),
      limitRejection: () => this.limitRejections.inc(),
      reconciled: () => this.conversationsReconciled.inc(),
    };
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

/** Clocks of two hosts may disagree by a little: a negative latency counts as none. */
function nonNegative(seconds: number): number {
  return Number.isFinite(seconds) && seconds > 0 ? seconds : 0;
}

/** The value, or undefined when it failed or took longer than `ms`. */
async function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
  });
  try {
    return await Promise.race([promise.catch(() => undefined), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
