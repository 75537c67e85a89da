/**
 * The `llm` agent's prompt (PROTOCOL.md "Context"): the instructions, the
 * conversation's first user message, the turn's own message, and as many of
 * the latest events as fit under `LLM_CONTEXT_TOKENS`, with one line saying
 * how many events were left out. The history is read from the newest event backwards, a page at a time,
 * and reading stops once the budget is spent: a long conversation is never
 * read whole.
 *
 * Stored events become model messages: user and agent `message`s are user and
 * assistant turns, agent `tool_call`s assistant tool calls, `tool_result`
 * observations tool results; everything else is skipped. Each tool result is
 * placed right after its call, and a call without its result (or a result
 * without its call, when the window cuts between them) is left out, so that
 * the prompt is always one that model APIs accept. Image and file URLs of
 * user messages are never passed on (no user URL reaches the network).
 */
import type { AgentContext } from '@cs/core';
import { isAction, type StoredEvent, type ToolDescription } from '@cs/protocol';
import type { PromptMessage, PromptToolCall } from './model-client.js';
import { MESSAGE_OVERHEAD_TOKENS, tokenCounter, type TokenCounter } from './token-counter.js';

/** Events read by the first page (`history.recent`), then by each older page (`history.range`). */
const FIRST_PAGE = 50;
const OLDER_PAGE = 200;
/** Events scanned from the start for the first user message before giving up. */
const FIRST_MESSAGE_SCAN = 1000;

export interface LlmPrompt {
  system: string | undefined;
  messages: PromptMessage[];
  /** Events between the first user message and the window that were left out. */
  leftOut: number;
  /** The prompt's size as counted (instructions, tools and messages). */
  tokens: number;
}

/** The prompt is too big even without history (instructions and tools alone). */
export class PromptTooLargeError extends Error {
  constructor() {
    super('the instructions and tools alone exceed LLM_CONTEXT_TOKENS');
    this.name = 'PromptTooLargeError';
  }
}

/** One event as the prompt holds it (`cause` as stored). */
type Entry = { id: number; cause: number | undefined } & (
  | { kind: 'user' | 'assistant'; text: string }
  | { kind: 'call'; callId: string; tool: string; input: unknown }
  | { kind: 'result'; callId: string; tool: string; text: string; isError: boolean }
);

/** The note that replaces what was left out. */
export function leftOutNote(count: number): string {
  return `[${count} earlier ${count === 1 ? 'event was' : 'events were'} left out here to fit the context]`;
}

/**
 * What one conversation's prompts keep from step to step: its first user
 * message, once found (stored events never change), so that each step does
 * not read the conversation's start again.
 */
export interface PromptMemory {
  first?: StoredEvent;
}

export async function buildLlmPrompt(
  context: Pick<AgentContext, 'history' | 'instructions' | 'trigger'>,
  tools: readonly ToolDescription[],
  maxTokens: number,
  memory: PromptMemory = {},
): Promise<LlmPrompt> {
  const counter = await tokenCounter();
  const countTextTokens = (text: string) => counter.count(text);
  const entryTokens = (entry: Entry) => tokensOf(entry, counter);
  const fitEntry = (entry: Entry, maxTokens: number) => fit(entry, maxTokens, counter);
  const system = context.instructions?.trim() ? context.instructions : undefined;
  const fixed =
    (system ? countTextTokens(system) + MESSAGE_OVERHEAD_TOKENS : 0) +
    (tools.length > 0 ? countTextTokens(JSON.stringify(tools)) : 0);
  const noteTokens = countTextTokens(leftOutNote(1_000_000)) + MESSAGE_OVERHEAD_TOKENS;
  const initialBudget = maxTokens - fixed - noteTokens;
  let budget = initialBudget;
  if (budget <= MESSAGE_OVERHEAD_TOKENS * 4) throw new PromptTooLargeError();
  // One huge event (a tool's output, a pasted file) must not push out all the others.
  const perEvent = Math.max(1, Math.floor(budget / 2));

  const { history } = context;
  const first = (memory.first ??= await firstUserMessage(context));
  let firstEntry: Entry | undefined;
  if (first) {
    firstEntry = toEntry(first);
    if (firstEntry) budget -= fitEntry(firstEntry, Math.floor(budget / 4));
  }
  // The turn's own message is always in the prompt, even when its steps' tool
  // results alone would fill it: its cost is set aside before the window's.
  const triggerEntry = context.trigger.id === first?.id ? undefined : toEntry(context.trigger);
  if (triggerEntry) budget -= fitEntry(triggerEntry, Math.min(budget, perEvent));
  let triggerKept = false;

  // Newest first, then reversed.
  const window: Entry[] = [];
  let oldestKept = history.last_event_id + 1;
  let reachedFirst = false;
  let full = false;
  let page = await history.recent(FIRST_PAGE);
  let pageStart = page[0]?.id;
  for (;;) {
    for (let i = page.length - 1; i >= 0 && !full; i -= 1) {
      const event = page[i]!;
      if (event.id >= oldestKept) continue;
      if (first && event.id <= first.id) {
        reachedFirst = true;
        break;
      }
      if (event.id === triggerEntry?.id) {
        window.push(triggerEntry);
        triggerKept = true;
        oldestKept = event.id;
        continue;
      }
      const entry = toEntry(event);
      if (entry) {
        let cost = entryTokens(entry);
        if (cost > perEvent) cost = fitEntry(entry, perEvent);
        if (cost > budget) {
          // The newest event is kept, cut to fit; an older one that does not fit ends the window.
          if (window.length > 0) {
            full = true;
            break;
          }
          cost = fitEntry(entry, budget);
        }
        budget -= cost;
        window.push(entry);
      }
      oldestKept = event.id;
    }
    if (full || reachedFirst || pageStart === undefined || pageStart <= 0) break;
    if (first && pageStart <= first.id + 1) break;
    const end = pageStart - 1;
    const start = Math.max(first ? first.id + 1 : 0, end - OLDER_PAGE + 1);
    page = [];
    for await (const event of history.range(start, end)) page.push(event);
    if (page.length === 0) break;
    pageStart = start;
  }
  // The window filled before the trigger: it goes before the window's events.
  const triggerApart = triggerEntry !== undefined && !triggerKept;
  if (triggerApart) window.push(triggerEntry);
  window.reverse();
  const ordered = inTurnOrder(window);

  // Ids are consecutive within a conversation (the store assigns them from 0),
  // so what lies between the first message and the window is a difference.
  const between = oldestKept - (first ? first.id + 1 : 0) - (triggerApart ? 1 : 0);
  const leftOut = full ? Math.max(0, between) : 0;

  const messages = toMessages(firstEntry ? [firstEntry] : [], ordered, leftOut);
  const tokens = fixed + (initialBudget - budget) + (leftOut > 0 ? noteTokens : 0);
  return { system, messages, leftOut, tokens };
}

/** The conversation's first user message, read from its start (a bounded range). */
async function firstUserMessage(
  context: Pick<AgentContext, 'history'>,
): Promise<StoredEvent | undefined> {
  const end = Math.min(context.history.last_event_id, FIRST_MESSAGE_SCAN - 1);
  for await (const event of context.history.range(0, end)) {
    if (event.source === 'user' && isAction(event) && event.action === 'message') return event;
  }
  return undefined;
}

/**
 * The window in the order of its turns: each event right after the user
 * message its turn answers (followed through `cause`: an answer or a tool
 * call to its message, a tool result to its call). An answer stored after a
 * later message (one queued behind its turn, or one that interrupted it)
 * then comes before that message, and the prompt ends with the trigger and
 * what this turn's own steps stored (PROTOCOL.md "Turns and steps"), never
 * with an earlier turn's answer: a provider would take a last assistant
 * message for the start of the answer to continue (Anthropic's prefill).
 * Without such late events this is the order of the ids.
 */
function inTurnOrder(window: readonly Entry[]): Entry[] {
  const turnOf = new Map<number, number>();
  for (const entry of window) {
    const cause = entry.kind === 'user' ? undefined : entry.cause;
    turnOf.set(entry.id, cause === undefined ? entry.id : (turnOf.get(cause) ?? cause));
  }
  // Array.prototype.sort is stable: within a turn, the order of the ids.
  return [...window].sort((a, b) => turnOf.get(a.id)! - turnOf.get(b.id)!);
}

function toEntry(event: StoredEvent): Entry | undefined {
  const id = event.id;
  const cause = event.cause;
  if (isAction(event)) {
    const args = event.args;
    if (event.action === 'message' && (event.source === 'user' || event.source === 'agent')) {
      const text = typeof args['content'] === 'string' ? args['content'] : '';
      return { kind: event.source === 'user' ? 'user' : 'assistant', id, cause, text };
    }
    if (event.action === 'tool_call' && event.source === 'agent') {
      const callId = args['tool_call_id'];
      const tool = args['tool'];
      if (typeof callId !== 'string' || typeof tool !== 'string') return undefined;
      return { kind: 'call', id, cause, callId, tool, input: args['arguments'] ?? {} };
    }
    return undefined;
  }
  if (event.observation === 'tool_result') {
    const { tool_call_id: callId, tool, is_error: isError } = event.extras;
    if (typeof callId !== 'string') return undefined;
    return {
      kind: 'result',
      id,
      cause,
      callId,
      tool: typeof tool === 'string' ? tool : 'unknown',
      text: event.content,
      isError: isError === true,
    };
  }
  return undefined;
}

function tokensOf(entry: Entry, counter: TokenCounter): number {
  const countTextTokens = (text: string) => counter.count(text);
  switch (entry.kind) {
    case 'call':
      return (
        countTextTokens(entry.tool) +
        countTextTokens(JSON.stringify(entry.input)) +
        countTextTokens(entry.callId) +
        MESSAGE_OVERHEAD_TOKENS
      );
    case 'result':
      return countTextTokens(entry.text) + countTextTokens(entry.callId) + MESSAGE_OVERHEAD_TOKENS;
    default:
      return countTextTokens(entry.text) + MESSAGE_OVERHEAD_TOKENS;
  }
}

/** Cuts the entry's text so that it costs at most `maxTokens`; returns what it costs then. */
function fit(entry: Entry, maxTokens: number, counter: TokenCounter): number {
  const cost = tokensOf(entry, counter);
  if (cost <= maxTokens || entry.kind === 'call') return cost;
  const marker = ' […cut to fit the context]';
  const room = maxTokens - (cost - counter.count(entry.text)) - counter.count(marker);
  entry.text = counter.truncate(entry.text, Math.max(0, room)) + marker;
  return tokensOf(entry, counter);
}

function toMessages(head: Entry[], window: Entry[], leftOut: number): PromptMessage[] {
  const messages: PromptMessage[] = [];
  for (const entry of head) pushEntry(messages, entry, new Map());
  if (leftOut > 0) messages.push({ role: 'user', content: leftOutNote(leftOut) });
  const results = new Map<string, Extract<Entry, { kind: 'result' }>>();
  const calls = new Set<string>();
  for (const entry of window) {
    if (entry.kind === 'result') results.set(entry.callId, entry);
    if (entry.kind === 'call') calls.add(entry.callId);
  }
  for (const entry of window) {
    if (entry.kind === 'result') continue; // placed after its call
    if (entry.kind === 'call' && !results.has(entry.callId)) continue;
    pushEntry(messages, entry, results);
  }
  return messages;
}

/** Appends one entry, merging a tool call into the tool calls message before it. */
function pushEntry(
  messages: PromptMessage[],
  entry: Entry,
  results: Map<string, Extract<Entry, { kind: 'result' }>>,
): void {
  if (entry.kind === 'user') {
    messages.push({ role: 'user', content: entry.text });
    return;
  }
  if (entry.kind === 'assistant') {
    messages.push({ role: 'assistant', content: entry.text });
    return;
  }
  if (entry.kind !== 'call') return;
  const result = results.get(entry.callId)!;
  const call: PromptToolCall = {
    id: entry.callId,
    tool: entry.tool,
    input: entry.input,
    result: result.text,
    isError: result.isError,
  };
  // Calls of one step share one message.
  const last = messages.at(-1);
  if (last?.role === 'tool_calls') last.calls.push(call);
  else messages.push({ role: 'tool_calls', calls: [call] });
}
