/**
 * Agent contexts for tests: a history over an array of stored events (read
 * the way the runtime serves it: `recent` and `range`, both counted, so that
 * a test can check that an agent does not read a long conversation whole).
 */
import type { AgentContext, ConversationHistory } from '@cs/core';
import { AgentOutputSchema } from '@cs/protocol';
import type { AgentOutput, StatusUpdate, StoredEvent, ToolDescription } from '@cs/protocol';

export class ArrayHistory implements ConversationHistory {
  /** Events handed out by `recent` and `range`, in all. */
  read = 0;

  constructor(private readonly events: StoredEvent[]) {}

  get last_event_id(): number {
    return this.events.at(-1)?.id ?? -1;
  }

  recent(limit: number): Promise<StoredEvent[]> {
    const page = this.events.slice(Math.max(0, this.events.length - limit));
    this.read += page.length;
    return Promise.resolve(page);
  }

  async *range(start: number, end: number): AsyncIterable<StoredEvent> {
    for (const event of this.events) {
      if (event.id < start || event.id > end) continue;
      this.read += 1;
      yield event;
    }
  }
}

let nextId = 0;
const at = '2026-01-01T00:00:00.000Z';

/** Stored events, numbered from 0 in the order made (call `resetEventIds` per test). */
export const events = {
  user(content: string, id = nextId++): StoredEvent {
    return {
      id,
      timestamp: at,
      source: 'user',
      action: 'message',
      args: { content, image_urls: [], file_urls: [] },
      message: content,
    };
  },
  agent(content: string, id = nextId++): StoredEvent {
    return {
      id,
      timestamp: at,
      source: 'agent',
      action: 'message',
      args: { content },
      message: content,
    };
  },
  toolCall(
    tool: string,
    args: Record<string, unknown>,
    toolCallId: string,
    id = nextId++,
  ): StoredEvent {
    return {
      id,
      timestamp: at,
      source: 'agent',
      action: 'tool_call',
      args: { tool, arguments: args, tool_call_id: toolCallId },
      // What the model wrote in the step before its calls: nothing here.
      message: '',
    };
  },
  toolResult(
    tool: string,
    content: string,
    toolCallId: string,
    isError = false,
    id = nextId++,
  ): StoredEvent {
    return {
      id,
      timestamp: at,
      source: 'environment',
      observation: 'tool_result',
      content,
      extras: { tool, tool_call_id: toolCallId, is_error: isError },
      message: content,
      cause: id - 1,
    };
  },
  stateChanged(state: string, id = nextId++): StoredEvent {
    return {
      id,
      timestamp: at,
      source: 'environment',
      observation: 'agent_state_changed',
      content: '',
      extras: { agent_state: state },
      message: '',
    };
  },
};

export function resetEventIds(): void {
  nextId = 0;
}

export const CURRENT_TIME_TOOL: ToolDescription = {
  name: 'current_time',
  description: 'The time in ISO 8601, UTC',
  parameters: { type: 'object', properties: {}, additionalProperties: false },
};

export interface TestContext extends AgentContext {
  history: ArrayHistory;
  statuses: Omit<StatusUpdate, 'status_update'>[];
}

/** A context for one step over `history` (its last user message is the trigger). */
export function contextOf(
  history: StoredEvent[],
  options: {
    tools?: ToolDescription[];
    signal?: AbortSignal;
    instructions?: string | null;
    state?: Record<string, unknown>;
    conversation_id?: string;
  } = {},
): TestContext {
  const trigger = [...history].reverse().find((e) => e.source === 'user') ?? history.at(-1)!;
  const statuses: Omit<StatusUpdate, 'status_update'>[] = [];
  return {
    conversation_id: options.conversation_id ?? 'conv-test',
    tenant_id: 'tenant-test',
    user_id: 'user-test',
    trigger,
    state: options.state ?? {},
    instructions: options.instructions ?? null,
    tools: options.tools ?? [],
    signal: options.signal ?? new AbortController().signal,
    history: new ArrayHistory(history),
    step: 1,
    statuses,
    notify: (status) => statuses.push(status),
  };
}

export async function collect<T>(outputs: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const output of outputs) all.push(output);
  return all;
}

/**
 * Runs `outputs` to its end, returning what it yielded and what it threw.
 * Each output must be one the runtime accepts (`AgentOutputSchema`).
 */
export async function settle(
  outputs: AsyncIterable<AgentOutput>,
): Promise<{ outputs: AgentOutput[]; error: unknown }> {
  const all: AgentOutput[] = [];
  try {
    for await (const output of outputs) {
      AgentOutputSchema.parse(output);
      all.push(output);
    }
  } catch (error) {
    return { outputs: all, error };
  }
  return { outputs: all, error: undefined };
}
