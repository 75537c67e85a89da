/**
 * The events a turn stores, as drafts: the answer, each tool call and its
 * result, and the step's metrics and state change riding on its first event.
 */
import type { StoredEvent } from '@cs/protocol';
import { isAction } from '@cs/protocol';
import type { EventDraft, StateDelta } from '../conversation.js';
import type { ModelUsageDelta } from '../usage.js';

export interface Accounting {
  metrics: {
    iterations: number;
    prompt_tokens: number;
    completion_tokens: number;
    cost_usd: number;
  };
  state: StateDelta;
  /** The step's model requests, recorded in `model_usage` with its first event. */
  usage?: ModelUsageDelta;
}

/** The step's metrics and state change ride on its first stored event. */
export function withAccounting(drafts: EventDraft[], accounting: Accounting): EventDraft[] {
  const [first, ...rest] = drafts;
  if (!first) return drafts;
  const stateDelta = { ...accounting.state, ...first.stateDelta };
  return [
    {
      ...first,
      metricsDelta: accounting.metrics,
      ...(accounting.usage ? { usage: accounting.usage } : {}),
      ...(Object.keys(stateDelta).length > 0 ? { stateDelta } : {}),
    },
    ...rest,
  ];
}

export function messageDraft(cause: number, content: string, interrupted = false): EventDraft {
  return {
    source: 'agent',
    cause,
    body: {
      action: 'message',
      args: interrupted ? { content, interrupted: true } : { content },
      message: content,
    },
  };
}

/** The tool a stored call names ('' when it names none). */
export function toolOf(call: StoredEvent): string {
  const tool = isAction(call) ? call.args['tool'] : undefined;
  return typeof tool === 'string' ? tool : '';
}

export function resultDraft(
  call: StoredEvent,
  content: string,
  flags: { is_error: boolean; rejected?: boolean; in_doubt?: boolean },
  stateDelta?: StateDelta,
): EventDraft {
  const args = isAction(call) ? call.args : {};
  return {
    source: 'environment',
    cause: call.id,
    body: {
      observation: 'tool_result',
      content,
      extras: { tool: args['tool'] ?? null, tool_call_id: args['tool_call_id'] ?? null, ...flags },
      message: content,
    },
    ...(stateDelta ? { stateDelta } : {}),
  };
}

/**
 * An id for a call the agent gave none: `call_` and 24 hex digits, within
 * what providers take back in a later prompt (OpenAI: at most 40 characters;
 * Anthropic: letters, digits, `_` and `-`).
 */
export function newToolCallId(): string {
  return `call_${crypto.randomUUID().replaceAll('-', '').slice(0, 24)}`;
}
