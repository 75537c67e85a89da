// What the agents' end-to-end specs share: a conversation created over REST
// and watched on a socket, a message said on it, what the store holds of it,
// and the predicates that tell the requests of the fake model servers apart
// (OpenAI-compatible bodies; `streaming` holds for Anthropic's too).
import { expect } from 'vitest';
import type { ServerEvent, StoredEvent } from '@cs/protocol';
import type { FakeModelServer, FakeReply } from '../fakes/fake-model-server.js';
import { ConversationClient, api, isAgentReply } from './clients.js';

type Body = Record<string, unknown>;

// --- conversations over REST and the socket --------------------------------------

/** Creates a conversation (expecting 201) and returns its id. */
export async function createConversation(
  baseUrl: string,
  token: string,
  body: Record<string, unknown>,
): Promise<string> {
  const created = await api<{ conversation_id: string }>(baseUrl, 'POST', '/api/conversations', {
    token,
    body,
  });
  expect(created.status, JSON.stringify(created.body)).toBe(201);
  return created.body.conversation_id;
}

/** Creates a conversation and connects a client to it on the same app. */
export async function openConversation(
  baseUrl: string,
  token: string,
  body: Record<string, unknown>,
): Promise<{ id: string; client: ConversationClient }> {
  const id = await createConversation(baseUrl, token, body);
  const client = await ConversationClient.connect(baseUrl, token, { conversation_id: id });
  return { id, client };
}

/** Sends a user message (expecting it accepted) and returns its event id. */
export async function say(client: ConversationClient, text: string): Promise<number> {
  const ack = await client.message(text);
  expect(ack.ok).toBe(true);
  return ack.ok ? ack.event_id : -1;
}

/**
 * Says `text` and waits for the agent's reply, expecting deltas that spell
 * `answer` before it; returns the cause and where the reply is in `client.events`.
 */
export async function sayAndExpectStreamedReply(
  client: ConversationClient,
  text: string,
  answer: string,
  timeoutMs: number,
): Promise<{ cause: number; replyAt: number }> {
  const cause = await say(client, text);
  await client.waitForReply(cause, timeoutMs);
  const replyAt = client.events.findIndex((e) => isAgentReply(e, cause));
  const deltas = client.events.filter(isDelta);
  expect(deltas.map((d) => d.delta).join('')).toBe(answer);
  expect(client.events.findIndex(isDelta)).toBeLessThan(replyAt);
  return { cause, replyAt };
}

/** Says `text`, waits for the reply and then for the title it brings, and returns the title. */
export async function sayAndReadTitle(
  client: ConversationClient,
  text: string,
  conversation: { baseUrl: string; token: string; id: string },
  timeoutMs: number,
): Promise<string> {
  const cause = await say(client, text);
  await client.waitForReply(cause, timeoutMs);
  await client.waitFor(
    (events) => events.some((e) => (e as { id?: unknown }).id === 'STATUS$TITLE_UPDATED'),
    timeoutMs,
    'title',
  );
  const { baseUrl, token, id } = conversation;
  const info = await api<{ title: string }>(baseUrl, 'GET', `/api/conversations/${id}`, { token });
  return info.body.title;
}

/** The first 100 stored events of a conversation (expecting 200). */
export async function storedEvents(
  baseUrl: string,
  token: string,
  id: string,
): Promise<StoredEvent[]> {
  const page = await api<{ events: StoredEvent[] }>(
    baseUrl,
    'GET',
    `/api/conversations/${id}/events?start_id=0&limit=100`,
    { token },
  );
  expect(page.status).toBe(200);
  return page.body.events;
}

/** The conversation's metrics from GET /state (expecting 200). */
export async function metricsOf(
  baseUrl: string,
  token: string,
  id: string,
): Promise<Record<string, number>> {
  const state = await api<{ metrics: Record<string, number> }>(
    baseUrl,
    'GET',
    `/api/conversations/${id}/state`,
    { token },
  );
  expect(state.status).toBe(200);
  return state.body.metrics;
}

export const isDelta = (e: ServerEvent): e is Extract<ServerEvent, { stream: true }> =>
  (e as { stream?: unknown }).stream === true;

/** The stored results of the tool call `toolCallId`. */
export const toolResultsOf = (stored: StoredEvent[], toolCallId: unknown) =>
  stored.filter(
    (e) =>
      'observation' in e &&
      e.observation === 'tool_result' &&
      e.extras['tool_call_id'] === toolCallId,
  ) as (StoredEvent & { content: string; extras: Record<string, unknown> })[];

// --- requests to the fake model servers -----------------------------------------

/** The text of the last user message a model request carries. */
export function lastUser(body: Body): string {
  const messages = (body['messages'] ?? []) as { role: string; content: unknown }[];
  const last = [...messages].reverse().find((m) => m.role === 'user');
  return typeof last?.content === 'string' ? last.content : JSON.stringify(last?.content ?? '');
}

export const hasToolResults = (body: Body) =>
  ((body['messages'] ?? []) as { role: string }[]).some((m) => m.role === 'tool');

/** A step's request (streamed), not a title's. */
export const streaming = (body: Body) => body['stream'] === true;

/** Scripts the model's answer to a user message tagged `tag` (first step, and after tool results). */
export function scriptTagged(
  model: FakeModelServer,
  tag: string,
  first: FakeReply,
  afterTools?: FakeReply,
): void {
  model.when((b) => streaming(b) && lastUser(b).includes(tag) && !hasToolResults(b), first);
  if (afterTools) {
    model.when((b) => streaming(b) && lastUser(b).includes(tag) && hasToolResults(b), afterTools);
  }
}
