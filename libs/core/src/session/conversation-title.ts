/**
 * The title of a conversation created without one (docs/protocol.md "Titles"):
 * after its first answer, the agent's `title()` if it has one, else the
 * fallback rule on the first user message; stored, then announced with
 * `STATUS$TITLE_UPDATED`. A failure leaves the conversation untitled. The
 * title request's usage counts in the conversation's metrics like a step's.
 */
import { MAX_AGENT_TITLE_CHARS, StatusId, cutText, isAction, storableText } from '@cs/protocol';
import type { StoredEvent } from '@cs/protocol';
import type { Agent } from '../agent.js';
import type { ConversationRef, MetricsDelta } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import type { RuntimeMetrics } from '../ports/runtime-metrics.port.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { SessionOutlet } from './session-outlet.js';
import type { StepUsage } from './step-runner.js';
import type { ModelUsageDelta } from '../usage.js';
import { fallbackTitle } from './title.js';
import type { TurnRunner } from './turn-runner.js';
import { isUserMessage } from './user-event-queue.js';

export interface TitleDeps {
  store: ConversationStore;
  ref: ConversationRef;
  agent: Agent;
  /** Where `STATUS$TITLE_UPDATED` goes. */
  outlet: Pick<SessionOutlet, 'publishStatus'>;
  reportError: (message: string, error: unknown) => void;
  /** Closing: a title found then is not stored. */
  lifecycle: Pick<SessionLifecycle, 'isClosing'>;
  /** The cost of a usage its agent did not price (`LLM_PRICES` of the conversation's model). */
  price: (usage: StepUsage) => number;
  /** The model its usage is recorded under (`TurnSettings.usageModel`). */
  usageModel: string;
  metrics: RuntimeMetrics;
}

export async function titleConversation(deps: TitleDeps, runner: TurnRunner): Promise<void> {
  const { store, ref, agent } = deps;
  try {
    let title = '';
    let usage: MetricsDelta | undefined;
    if (agent.title) {
      try {
        const made = await agent.title(runner.titleContext());
        if (made.usage) usage = titleUsage(deps, made.usage);
        // Cleaned as the store would refuse it (the conversation stayed untitled);
        // when nothing is left, the first message's rule below.
        const cleaned = storableText(made.title);
        if (cleaned !== made.title) {
          deps.reportError(
            'the agent made a title with characters that cannot be stored (NUL, an unpaired surrogate)',
            `${made.title.length - cleaned.length} removed`,
          );
        }
        title = cutText(cleaned.trim(), MAX_AGENT_TITLE_CHARS);
      } catch (error) {
        deps.reportError('the agent could not make a title', error);
      }
    }
    if (title === '') title = fallbackTitle(await firstUserMessage(deps, runner.trigger));
    if (deps.lifecycle.isClosing) return;
    // A title given meanwhile (PATCH) is the user's: it stays.
    const current = await store.getConversation(ref.tenantId, ref.conversationId);
    if (current?.title) title = '';
    const counted = usage ? { addMetrics: usage, addUsage: modelUsageOf(deps, usage) } : {};
    if (title === '') {
      if (usage) await store.updateConversation(ref.tenantId, ref.conversationId, counted);
      return;
    }
    await store.updateConversation(ref.tenantId, ref.conversationId, { title, ...counted });
    deps.outlet.publishStatus({
      status_update: true,
      type: 'info',
      id: StatusId.TitleUpdated,
      message: title,
    });
  } catch (error) {
    deps.reportError('could not store a title', error);
  }
}

function modelUsageOf(deps: TitleDeps, usage: MetricsDelta): ModelUsageDelta {
  return {
    model: deps.usageModel,
    promptTokens: usage.prompt_tokens ?? 0,
    completionTokens: usage.completion_tokens ?? 0,
    costUsd: usage.cost_usd ?? 0,
    requests: 1,
  };
}

function titleUsage(
  deps: TitleDeps,
  usage: { prompt_tokens: number; completion_tokens: number; cost_usd?: number },
): MetricsDelta {
  const step: StepUsage = {
    promptTokens: usage.prompt_tokens,
    completionTokens: usage.completion_tokens,
    ...(usage.cost_usd === undefined ? {} : { costUsd: usage.cost_usd }),
  };
  deps.metrics.tokensUsed(step.promptTokens, step.completionTokens);
  return {
    prompt_tokens: step.promptTokens,
    completion_tokens: step.completionTokens,
    cost_usd: step.costUsd ?? deps.price(step),
  };
}

async function firstUserMessage(deps: TitleDeps, trigger: StoredEvent): Promise<string> {
  const { store, ref } = deps;
  const first =
    (
      await store.readEvents(ref.tenantId, ref.conversationId, {
        fromId: 0,
        toId: trigger.id,
        limit: 200,
      })
    ).find((event) => isUserMessage(event) && event.undone_by === undefined) ?? trigger;
  return isAction(first) && typeof first.args['content'] === 'string' ? first.args['content'] : '';
}
