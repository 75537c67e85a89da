/**
 * The `llm` agent's prompt (docs/protocol.md "Context"): the instructions, the
 * conversation's first user message, the turn's own message, and as many of
 * the latest events as fit under `LLM_CONTEXT_TOKENS`, with one line saying
 * how many events were left out. The history is read from the newest event
 * backwards, a page at a time, and reading stops once the budget is spent: a
 * long conversation is never read whole. What the kept events become as
 * model messages is `prompt-messages.ts`; image and file URLs of user
 * messages are never passed on (no user URL reaches the network).
 */
import type { AgentContext } from '@cs/core';
import { isAction, type StoredEvent, type ToolDescription } from '@cs/protocol';
import type { PromptMessage } from './model-client.js';
import { inTurnOrder, toEntry, toMessages, type Entry } from './prompt-messages.js';
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

  const note = leftOut > 0 ? leftOutNote(leftOut) : null;
  const messages = toMessages(firstEntry ? [firstEntry] : [], ordered, note);
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

function tokensOf(entry: Entry, counter: TokenCounter): number {
  const countTextTokens = (text: string) => counter.count(text);
  switch (entry.kind) {
    case 'call':
      return (
        countTextTokens(entry.text) +
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
  if (cost <= maxTokens || entry.text === '') return cost;
  const marker = ' […cut to fit the context]';
  const room = maxTokens - (cost - counter.count(entry.text)) - counter.count(marker);
  entry.text = counter.truncate(entry.text, Math.max(0, room)) + marker;
  return tokensOf(entry, counter);
}
