/**
 * `replay_json` of a create (docs/protocol.md): a client's history, stored as the
 * new conversation's first events and marked answered, so that no agent runs
 * any of it again.
 *
 * Two shapes are read. Events without ids (a history a client wrote) are
 * stored in their order, each user event followed by a settled state change
 * caused by it. Events with their ids (the events of an export, `GET
 * /conversations/:id/export`) are stored under those very ids, with their
 * causes, and their rewinds keep their meaning: the events a rewind undid are
 * stored undone by it (so no agent sees them again), and an `undone_by` the
 * client gives must be that mark. The export's last line, `{ state }`, may
 * end the array: its conversation keys become the new conversation's state
 * (`user:` and `app:` keys are the user's and the app's, not the history's).
 */
import { z } from 'zod';
import {
  BadRequestError,
  agentStateChangeDraft,
  splitStateDelta,
  undoneMarksOf,
  type EventDraft,
  type RewindPoint,
} from '@cs/core';
import {
  ActionBodySchema,
  EventSourceSchema,
  REWIND_ACTION,
  readAgentStateChange,
  MAX_JSON_DEPTH,
  MAX_MESSAGE_CONTENT_CHARS,
  ObservationBodySchema,
  findJsonTooDeep,
  findUnstorableText,
  withoutProtoKey,
} from '@cs/protocol';

/** docs/protocol.md: `replay_json` holds at most this many events. */
export const MAX_REPLAY_EVENTS = 1_000;

const ReplayObjectSchema = withoutProtoKey(z.record(z.string(), z.unknown()));
const EventIdSchema = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
/** The envelope an exported event carries; its `timestamp` and `client_event_id` are not replayed. */
const ReplayEnvelopeSchema = z.object({
  id: EventIdSchema.optional(),
  cause: EventIdSchema.optional(),
  undone_by: EventIdSchema.optional(),
});
const ReplayActionSchema = ActionBodySchema.extend(ReplayEnvelopeSchema.shape).extend({
  source: EventSourceSchema.default('agent'),
  args: ReplayObjectSchema,
});
const ReplayObservationSchema = ObservationBodySchema.extend(ReplayEnvelopeSchema.shape).extend({
  source: EventSourceSchema.default('environment'),
  extras: ReplayObjectSchema,
});
/** The last line of an export. */
const ReplayStateSchema = z.strictObject({ state: ReplayObjectSchema });

/** One replayed event as read: its draft and the envelope it came with. */
interface ReplayedEvent {
  draft: EventDraft;
  id?: number;
  cause?: number;
  undoneBy?: number;
}

/** `replay_json` read: its events, whether they came with their ids, and the state that ends it. */
export interface ParsedReplay {
  events: readonly ReplayedEvent[];
  /** True when the events carry their ids (an export's): stored under them, rewinds and all. */
  withIds: boolean;
  /** The conversation keys of a trailing `{ state }`; empty without one. */
  state: Record<string, unknown>;
}

/** A create without `replay_json`. */
export const NO_REPLAY: ParsedReplay = { events: [], withIds: false, state: {} };

/** The field of a replayed event's part: `replay_json[3].args.content`. */
function fieldOf(index: number, path: readonly PropertyKey[] = []): string {
  return [`replay_json[${index}]`, ...path.map(String)].join('.');
}

function refuse(index: number, path: readonly PropertyKey[], why: string): never {
  const field = fieldOf(index, path);
  throw new BadRequestError(`${field}: ${why}`, field);
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
      refuse(
        index,
        ['args', 'content'],
        `a message's content is a string of at most ${MAX_MESSAGE_CONTENT_CHARS} characters`,
      );
    }
  }
  const unstorable = findUnstorableText(body);
  if (unstorable !== undefined) {
    refuse(
      index,
      unstorable,
      'text contains characters that cannot be stored (NUL, an unpaired surrogate)',
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

/** An export's last line: an object with `state` and no event fields. */
function isStateLine(line: unknown): boolean {
  return (
    typeof line === 'object' &&
    line !== null &&
    !Array.isArray(line) &&
    'state' in line &&
    !('action' in line) &&
    !('observation' in line)
  );
}

function parseEvent(event: unknown, index: number): ReplayedEvent {
  const shape = shapeOf(event);
  if (!shape) refuse(index, [], 'an event has an "action" or an "observation"');
  const result = shape.safeParse(event);
  if (!result.success) {
    const issue = result.error.issues[0];
    refuse(index, issue?.path ?? [], issue?.message ?? 'invalid');
  }
  const { source, id, cause, undone_by: undoneBy, ...body } = result.data;
  assertLiveLimits(index, body);
  return {
    draft: { source, body },
    ...(id === undefined ? {} : { id }),
    ...(cause === undefined ? {} : { cause }),
    ...(undoneBy === undefined ? {} : { undoneBy }),
  };
}

/** A user `rewind` action among the replayed events: the point it goes back to. */
function rewindOf(event: ReplayedEvent, index: number): number | null {
  const { source, body } = event.draft;
  if (source !== 'user' || !('action' in body) || body.action !== REWIND_ACTION) return null;
  const target = body.args['to_event_id'];
  if (typeof target !== 'number' || !Number.isSafeInteger(target)) {
    refuse(index, ['args', 'to_event_id'], 'a rewind goes back to an event id');
  }
  return target;
}

/**
 * Events with their ids are stored under them: each id is its place, a cause
 * names an event before it, and the rewinds' marks are the ones given.
 */
function assertExactHistory(events: readonly ReplayedEvent[]): void {
  const rewinds: RewindPoint[] = [];
  for (const [index, event] of events.entries()) {
    if (event.id !== index) {
      refuse(
        index,
        ['id'],
        `must be ${index}: the events are replayed with every id, in order from 0`,
      );
    }
    if (event.cause !== undefined && event.cause >= index) {
      refuse(index, ['cause'], 'must be the id of an event before this one');
    }
    const toEventId = rewindOf(event, index);
    if (toEventId !== null) rewinds.push({ id: index, toEventId });
  }
  const { marks, invalid } = undoneMarksOf(rewinds);
  if (invalid !== null) {
    refuse(invalid, ['args', 'to_event_id'], 'a rewind goes back to a live event before it, or -1');
  }
  for (const [index, event] of events.entries()) {
    const mark = marks.get(index);
    if (event.undoneBy !== undefined && event.undoneBy !== mark) {
      refuse(
        index,
        ['undone_by'],
        mark === undefined
          ? 'no rewind among the events undid this one'
          : `the rewind that undid this event is ${mark}`,
      );
    }
  }
}

/** Events without ids cannot say what a rewind undid: they hold none, nor a mark. */
function assertPlainHistory(events: readonly ReplayedEvent[]): void {
  for (const [index, event] of events.entries()) {
    if (event.undoneBy !== undefined) {
      refuse(index, ['undone_by'], "an undone mark is replayed with the events' ids (an export's)");
    }
    if (rewindOf(event, index) !== null) {
      refuse(index, [], "a rewind is replayed with the events' ids (an export's)");
    }
  }
}

/** `replay_json` read; `BAD_REQUEST` naming the first field that is wrong. */
export function parseReplay(json: string): ParsedReplay {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    throw new BadRequestError('replay_json is not valid JSON', 'replay_json');
  }
  if (findJsonTooDeep(parsed) !== undefined) {
    throw new BadRequestError(`replay_json is nested deeper than ${MAX_JSON_DEPTH}`, 'replay_json');
  }
  if (!Array.isArray(parsed)) {
    throw new BadRequestError('replay_json is a JSON array of events', 'replay_json');
  }
  const lines: unknown[] = parsed;
  const stateLine = lines.length > 0 && isStateLine(lines.at(-1)) ? lines.at(-1) : undefined;
  const eventLines = stateLine === undefined ? lines : lines.slice(0, -1);
  if (eventLines.length > MAX_REPLAY_EVENTS) {
    throw new BadRequestError(
      `replay_json holds at most ${MAX_REPLAY_EVENTS} events; this one has ${eventLines.length}`,
      'replay_json',
    );
  }
  const events = eventLines.map(parseEvent);
  const withIds = events.some((event) => event.id !== undefined);
  if (withIds) assertExactHistory(events);
  else assertPlainHistory(events);
  let state: Record<string, unknown> = {};
  if (stateLine !== undefined) {
    const index = lines.length - 1;
    const result = ReplayStateSchema.safeParse(stateLine);
    if (!result.success) {
      const issue = result.error.issues[0];
      refuse(index, issue?.path ?? [], issue?.message ?? 'invalid');
    }
    const unstorable = findUnstorableText(result.data.state);
    if (unstorable !== undefined) {
      refuse(index, ['state', ...unstorable], 'text contains characters that cannot be stored');
    }
    state = splitStateDelta(result.data.state).conversation;
  }
  return { events, withIds, state };
}

/**
 * The drafts to store. A replayed history was answered already: the new
 * conversation's `answered_through` is its last user event, so that no agent
 * runs any of it again. Its own state changes are history, not the
 * conversation's state: a replay whose last one leaves the agent anything
 * but awaiting input (`running`, awaiting a confirmation, paused…) ends with
 * one that does. Without ids, each user event is also followed by a settled
 * state change caused by it; with them, the events keep their ids, and only
 * such an end is added after them. The trailing state rides on the last draft.
 */
export function replayDrafts(replay: ParsedReplay): EventDraft[] {
  const drafts: EventDraft[] = [];
  let lastUser: number | undefined;
  let unsettled = false;
  for (const event of replay.events) {
    drafts.push(
      replay.withIds && event.cause !== undefined
        ? { ...event.draft, cause: event.cause }
        : event.draft,
    );
    const change = readAgentStateChange(event.draft.body);
    if (change) unsettled = change.agentState !== 'awaiting_user_input';
    if (event.draft.source === 'user') {
      lastUser = drafts.length - 1;
      if (!replay.withIds) {
        drafts.push(replayedMarker(lastUser));
        unsettled = false;
      }
    }
  }
  const hasState = Object.keys(replay.state).length > 0;
  if (unsettled || (hasState && drafts.length === 0)) drafts.push(replayedMarker(lastUser));
  const last = drafts.at(-1);
  // With ids no marker answers each user event: the last draft answers them all.
  const answers = replay.withIds ? lastUser : undefined;
  if (last && (answers !== undefined || hasState)) {
    drafts[drafts.length - 1] = {
      ...last,
      ...(answers === undefined ? {} : { answers: Math.max(last.answers ?? -1, answers) }),
      ...(hasState ? { stateDelta: { ...last.stateDelta, ...replay.state } } : {}),
    };
  }
  return drafts;
}

function replayedMarker(cause: number | undefined): EventDraft {
  return agentStateChangeDraft(
    'awaiting_user_input',
    cause === undefined ? { reason: 'replayed' } : { cause, answers: cause, reason: 'replayed' },
  );
}
