/**
 * Branching (docs/protocol.md "Branching: fork, rewind, edit, regenerate"): the
 * bodies of its routes and the stored rewind event. A rewind appends
 * `{ source: "user", action: "rewind", args: { to_event_id } }`; every event
 * after `to_event_id` and before it is then read with `undone_by: <its id>`.
 */
import { z } from 'zod';
import { isAction, type StoredEvent } from './events.js';
import { MAX_MESSAGE_CONTENT_CHARS, MAX_TITLE_CHARS } from './limits.js';
import { MetadataSchema } from './rest.js';

/** The action name of a rewind event. */
export const REWIND_ACTION = 'rewind';

const EventIdSchema = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);

export const ForkBodySchema = z.strictObject({
  /** Default: the source's last event. */
  at_event_id: EventIdSchema.optional(),
  title: z.string().max(MAX_TITLE_CHARS).optional(),
  metadata: MetadataSchema.optional(),
});
export type ForkBody = z.infer<typeof ForkBodySchema>;

export const RewindBodySchema = z.strictObject({
  to_event_id: EventIdSchema,
});
export type RewindBody = z.infer<typeof RewindBodySchema>;

export const EditBodySchema = z.strictObject({
  content: z.string().max(MAX_MESSAGE_CONTENT_CHARS),
});
export type EditBody = z.infer<typeof EditBodySchema>;

/** `POST …/regenerate` takes `{}` (or no body). */
export const RegenerateBodySchema = z.strictObject({});

/** The point a stored rewind event went back to; null when `event` is not one. */
export function rewindTarget(event: StoredEvent): number | null {
  if (event.source !== 'user' || !isAction(event) || event.action !== REWIND_ACTION) return null;
  const target = event.args['to_event_id'];
  return typeof target === 'number' && Number.isSafeInteger(target) ? target : null;
}

/** True when the event was undone by a rewind (read with `undone_by`). */
export function isUndone(event: StoredEvent): boolean {
  return event.undone_by !== undefined;
}
