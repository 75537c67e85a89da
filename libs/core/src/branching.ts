/**
 * What both stores write for branching (docs/protocol.md "Branching"), built in
 * one place: the rewind event, the `tool_result` a fork or rewind gives a
 * call left without one, and the state delta that takes a state back.
 */
import { REWIND_ACTION, isAction, type StoredEvent } from '@cs/protocol';
import type { EventDraft, StateDelta } from './conversation.js';

/** The stored rewind event; its delta takes the conversation-scope state back. */
export function rewindDraft(
  toEventId: number,
  stateDelta: StateDelta,
  clientEventId?: string,
): EventDraft {
  return {
    source: 'user',
    body: { action: REWIND_ACTION, args: { to_event_id: toEventId }, message: '' },
    ...(Object.keys(stateDelta).length === 0 ? {} : { stateDelta }),
    ...(clientEventId === undefined ? {} : { clientEventId }),
  };
}

/** Why a call has no result: it was copied into a fork, or a rewind cut it off. */
export type UnfinishedBy = 'forked' | 'rewound';

const UNFINISHED_TEXT: Record<UnfinishedBy, string> = {
  forked:
    'This tool call did not run in this conversation: it was copied from another one by a fork.',
  rewound: 'This tool call did not run: the conversation was rewound before it had a result.',
};

/** The `tool_result` (`is_error`, `extras.forked` or `extras.rewound`) of a call that will never run. */
export function unfinishedCallResult(call: StoredEvent, by: UnfinishedBy): EventDraft {
  const args = isAction(call) ? call.args : {};
  const content = UNFINISHED_TEXT[by];
  return {
    source: 'environment',
    cause: call.id,
    body: {
      observation: 'tool_result',
      content,
      extras: {
        tool: args['tool'] ?? null,
        tool_call_id: args['tool_call_id'] ?? null,
        is_error: true,
        [by]: true,
      },
      message: content,
    },
  };
}

/** The delta that turns `current` into `target` (a key `target` lacks is deleted: null). */
export function stateDeltaBetween(
  current: Record<string, unknown>,
  target: Record<string, unknown>,
): StateDelta {
  const delta: StateDelta = {};
  for (const key of Object.keys(current)) if (!(key in target)) delta[key] = null;
  for (const [key, value] of Object.entries(target)) {
    if (JSON.stringify(current[key]) !== JSON.stringify(value)) delta[key] = value;
  }
  return delta;
}

/** Agent states a fork does not keep: its agent is not running, nor asking. */
const UNSETTLED = new Set([
  'loading',
  'running',
  'awaiting_user_confirmation',
  'user_confirmed',
  'user_rejected',
]);

/** The agent state a fork starts in, from the last one it copied. */
export function forkAgentState(copied: string | null): string | null {
  return copied !== null && UNSETTLED.has(copied) ? 'stopped' : copied;
}

/** A stored rewind: its own id and the point it went back to. */
export interface RewindPoint {
  id: number;
  toEventId: number;
}

/** The undone marks of a gap-free log's rewinds, and the first rewind that could not have been stored. */
export interface UndoneMarks {
  /** Event id → id of the rewind that undid it. */
  marks: Map<number, number>;
  /** The id of the first rewind whose point is not a live event before it; null when none. */
  invalid: number | null;
}

/**
 * The undone marks that a log's rewinds made (a replayed history: its events
 * are stored together, the marks after them): each rewind, in id order,
 * undoes the events after its point and before itself that no earlier rewind
 * undid, as `rewind` did when it was stored. A point must be -1 or a live
 * event before the rewind, as `rewind` requires.
 */
export function undoneMarksOf(rewinds: readonly RewindPoint[]): UndoneMarks {
  const marks = new Map<number, number>();
  for (const rewind of [...rewinds].sort((a, b) => a.id - b.id)) {
    const { id, toEventId } = rewind;
    if (
      !Number.isSafeInteger(toEventId) ||
      toEventId < -1 ||
      toEventId >= id ||
      marks.has(toEventId)
    ) {
      return { marks, invalid: id };
    }
    for (let undone = toEventId + 1; undone < id; undone += 1) {
      if (!marks.has(undone)) marks.set(undone, id);
    }
  }
  return { marks, invalid: null };
}
