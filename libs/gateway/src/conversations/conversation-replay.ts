/**
 * `replay_json` of a create (docs/protocol.md): a client's history, stored as the
 * new conversation's first events and marked answered, so that no agent runs
 * any of it again.
 */
import { z } from 'zod';
import { BadRequestError, agentStateChangeDraft, type EventDraft } from '@cs/core';
import {
  ActionBodySchema,
  EventSourceSchema,
  readAgentStateChange,
  MAX_JSON_DEPTH,
  MAX_MESSAGE_CONTENT_CHARS,
  ObservationBodySchema,
  findJsonTooDeep,
  findUnstorableText,
  withoutProtoKey,
} from '@cs/protocol';

/** docs/protocol.md: `replay_json` holds at most this many events. */
const MAX_REPLAY_EVENTS = 1_000;

const ReplayObjectSchema = withoutProtoKey(z.record(z.string(), z.unknown()));
const ReplayActionSchema = ActionBodySchema.extend({
  source: EventSourceSchema.default('agent'),
  args: ReplayObjectSchema,
});
const ReplayObservationSchema = ObservationBodySchema.extend({
  source: EventSourceSchema.default('environment'),
  extras: ReplayObjectSchema,
});

/** The field of a replayed event's part: `replay_json[3].args.content`. */
function fieldOf(index: number, path: readonly PropertyKey[] = []): string {
  return [`replay_json[${index}]`, ...path.map(String)].join('.');
}

/**
 * A replayed event is client input like a live one: a message's text is
 * held to the limit of a live message (a 900,000-character one was stored),
 * and text Postgres cannot store is refused naming its field.
 */
function assertLiveLimits(index: number, body: EventDraft['body']): void {
  if ('action' in body && body.action === 'message') {
    const content = body.args['content'];
    if (typeof content !== 'string' || content.length > MAX_MESSAGE_CONTENT_CHARS) {
      const field = fieldOf(index, ['args', 'content']);
      throw new BadRequestError(
        `${field}: a message's content is a string of at most ${MAX_MESSAGE_CONTENT_CHARS} characters`,
        field,
      );
    }
  }
  const unstorable = findUnstorableText(body);
  if (unstorable !== undefined) {
    const field = fieldOf(index, unstorable);
    throw new BadRequestError(
      `${field}: text contains characters that cannot be stored (NUL, an unpaired surrogate)`,
      field,
    );
  }
}

/**
 * The schema of one replayed event: an action or an observation, told apart
 * by which of the two fields it has, so that its errors are that shape's
 * (not a union's "Invalid input"); null when it has neither.
 */
function shapeOf(event: unknown) {
  if (typeof event !== 'object' || event === null || Array.isArray(event)) return null;
  if ('action' in event) return ReplayActionSchema;
  if ('observation' in event) return ReplayObservationSchema;
  return null;
}

/** The events of `replay_json`; `BAD_REQUEST` naming the first field that is wrong. */
export function parseReplay(json: string): EventDraft[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    throw new BadRequestError('replay_json is not valid JSON', 'replay_json');
  }
  if (findJsonTooDeep(parsed) !== undefined) {
    throw new BadRequestError(`replay_json is nested deeper than ${MAX_JSON_DEPTH}`, 'replay_json');
  }
  const list = z.array(z.unknown()).max(MAX_REPLAY_EVENTS).safeParse(parsed);
  if (!list.success) {
    const issue = list.error.issues[0];
    throw new BadRequestError(`replay_json: ${issue?.message ?? 'invalid'}`, 'replay_json');
  }
  return list.data.map((event, index): EventDraft => {
    const shape = shapeOf(event);
    if (!shape) {
      throw new BadRequestError(
        `${fieldOf(index)}: an event has an "action" or an "observation"`,
        fieldOf(index),
      );
    }
    const result = shape.safeParse(event);
    if (!result.success) {
      const issue = result.error.issues[0];
      const path = fieldOf(index, issue?.path ?? []);
      throw new BadRequestError(`${path}: ${issue?.message ?? 'invalid'}`, path);
    }
    const { source, ...body } = result.data;
    assertLiveLimits(index, body);
    return { source, body };
  });
}

/**
 * A replayed history was answered already: each of its user events is
 * followed by a settled state change caused by it, so that no agent runs it
 * again. Its own state changes are history, not the conversation's state: a
 * replay whose last one leaves the agent anything but awaiting input
 * (`running`, awaiting a confirmation, paused…) ends with one that does. A new
 * conversation's events are numbered from 0.
 */
export function withReplayedMarkers(replay: readonly EventDraft[]): EventDraft[] {
  const drafts: EventDraft[] = [];
  let lastUser: number | undefined;
  let unsettled = false;
  for (const draft of replay) {
    drafts.push(draft);
    const change = readAgentStateChange(draft.body);
    if (change) unsettled = change.agentState !== 'awaiting_user_input';
    if (draft.source === 'user') {
      lastUser = drafts.length - 1;
      drafts.push(replayedMarker(lastUser));
      unsettled = false;
    }
  }
  if (unsettled) drafts.push(replayedMarker(lastUser));
  return drafts;
}

function replayedMarker(cause: number | undefined): EventDraft {
  return agentStateChangeDraft(
    'awaiting_user_input',
    cause === undefined ? { reason: 'replayed' } : { cause, answers: cause, reason: 'replayed' },
  );
}
