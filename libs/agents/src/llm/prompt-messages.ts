/**
 * Stored events as the messages of a model prompt, in a form every provider
 * accepts whatever history the service stored: each event in its turn, each
 * tool result with its own call (through `cause`), the calls of one step in
 * one message with the text the model wrote before them, and no empty text.
 */
import { isAction, type StoredEvent } from '@cs/protocol';
import type { PromptMessage, PromptToolCall } from './model-client.js';

/** One event as the prompt holds it (`cause` as stored). */
export type Entry = { id: number; cause: number | undefined } & (
  | { kind: 'user' | 'assistant'; text: string }
  /** `text`: what the model wrote in the step before its calls (stored as its first call's `message`). */
  | { kind: 'call'; callId: string; tool: string; input: unknown; text: string }
  | { kind: 'result'; callId: string; tool: string; text: string; isError: boolean }
);

type CallEntry = Extract<Entry, { kind: 'call' }>;
type ResultEntry = Extract<Entry, { kind: 'result' }>;

/**
 * Stands for a user message without text (only attachments, which are never
 * passed on): providers refuse an empty turn, and the model must still see
 * that the user said something.
 */
export const EMPTY_USER_MESSAGE = '[a message without text]';
/** Stands for a tool result without text (Anthropic refuses an empty error result). */
export const EMPTY_RESULT = '[no output]';
export const EMPTY_ERROR_RESULT = '[the tool failed without saying why]';

/**
 * The event as the prompt holds it, or undefined when the prompt leaves it
 * out: anything but messages, tool calls and tool results, and an answer
 * without text (a blank text block is refused by Anthropic, and says nothing).
 */
export function toEntry(event: StoredEvent): Entry | undefined {
  const id = event.id;
  const cause = event.cause;
  if (isAction(event)) {
    const args = event.args;
    if (event.action === 'message' && (event.source === 'user' || event.source === 'agent')) {
      const content = typeof args['content'] === 'string' ? args['content'] : '';
      if (event.source === 'agent') {
        return isBlank(content) ? undefined : { kind: 'assistant', id, cause, text: content };
      }
      return { kind: 'user', id, cause, text: isBlank(content) ? EMPTY_USER_MESSAGE : content };
    }
    if (event.action === 'tool_call' && event.source === 'agent') {
      const callId = args['tool_call_id'];
      const tool = args['tool'];
      if (typeof callId !== 'string' || typeof tool !== 'string') return undefined;
      const text = isBlank(event.message) ? '' : event.message;
      return { kind: 'call', id, cause, callId, tool, input: args['arguments'] ?? {}, text };
    }
    return undefined;
  }
  if (event.observation === 'tool_result') {
    const { tool_call_id: callId, tool, is_error: isError } = event.extras;
    if (typeof callId !== 'string') return undefined;
    const failed = isError === true;
    const blank = isBlank(event.content);
    return {
      kind: 'result',
      id,
      cause,
      callId,
      tool: typeof tool === 'string' ? tool : 'unknown',
      text: blank ? (failed ? EMPTY_ERROR_RESULT : EMPTY_RESULT) : event.content,
      isError: failed,
    };
  }
  return undefined;
}

/**
 * The window in the order of its turns: each event right after the user
 * message its turn answers (followed through `cause`: an answer or a tool
 * call to its message, a tool result to its call). An answer stored after a
 * later message (one queued behind its turn, or one that interrupted it)
 * then comes before that message, and the prompt ends with the trigger and
 * what this turn's own steps stored (docs/protocol.md "Turns and steps"), never
 * with an earlier turn's answer: a provider would take a last assistant
 * message for the start of the answer to continue (Anthropic's prefill).
 * Without such late events this is the order of the ids.
 */
export function inTurnOrder(window: readonly Entry[]): Entry[] {
  const turnOf = new Map<number, number>();
  for (const entry of window) {
    const cause = entry.kind === 'user' ? undefined : entry.cause;
    turnOf.set(entry.id, cause === undefined ? entry.id : (turnOf.get(cause) ?? cause));
  }
  // Array.prototype.sort is stable: within a turn, the order of the ids.
  return [...window].sort((a, b) => turnOf.get(a.id)! - turnOf.get(b.id)!);
}

/**
 * The messages of `head` (the first user message), the note for what was
 * left out, then the window (in turn order). A tool result goes with the
 * call its `cause` names (else, for events without one, the latest call of
 * its `tool_call_id`), so that two calls with one id (a provider that counts
 * `call_0` afresh each response) each get their own result; a call without
 * its result, and a result without its call, are left out. The calls of one
 * step (no result between them) share one message; an id already used in
 * the prompt is made unique, as providers require.
 */
export function toMessages(head: Entry[], window: Entry[], note: string | null): PromptMessage[] {
  const messages: PromptMessage[] = head.flatMap((entry) =>
    entry.kind === 'user' || entry.kind === 'assistant'
      ? [{ role: entry.kind, content: entry.text }]
      : [],
  );
  if (note !== null) messages.push({ role: 'user', content: note });
  const resultOf = resultsOfCalls(window);
  const usedIds = new Set<string>();
  let stepOpen = false;
  for (const entry of window) {
    if (entry.kind === 'result') {
      stepOpen = false; // a result ends its step's calls
      continue;
    }
    if (entry.kind !== 'call') {
      stepOpen = false;
      messages.push({ role: entry.kind, content: entry.text });
      continue;
    }
    const result = resultOf.get(entry.id);
    if (!result) continue;
    const id = usedIds.has(entry.callId) ? `call_cs${entry.id}` : entry.callId;
    usedIds.add(id);
    const call: PromptToolCall = {
      id,
      tool: entry.tool,
      input: entry.input,
      result: result.text,
      isError: result.isError,
    };
    const last = messages.at(-1);
    if (stepOpen && last?.role === 'tool_calls') last.calls.push(call);
    else
      messages.push({
        role: 'tool_calls',
        ...(entry.text ? { text: entry.text } : {}),
        calls: [call],
      });
    stepOpen = true;
  }
  return messages;
}

/** Each call's result, by the call's event id. */
function resultsOfCalls(window: readonly Entry[]): Map<number, ResultEntry> {
  const callsById = new Map<number, CallEntry>();
  const latestByCallId = new Map<string, CallEntry>();
  const resultOf = new Map<number, ResultEntry>();
  for (const entry of window) {
    if (entry.kind === 'call') {
      callsById.set(entry.id, entry);
      latestByCallId.set(entry.callId, entry);
    } else if (entry.kind === 'result') {
      const call =
        (entry.cause === undefined ? undefined : callsById.get(entry.cause)) ??
        latestByCallId.get(entry.callId);
      if (call && !resultOf.has(call.id)) resultOf.set(call.id, entry);
    }
  }
  return resultOf;
}

function isBlank(text: string): boolean {
  return text.trim() === '';
}
