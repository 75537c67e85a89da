/**
 * Idempotent sends: an event sent again with a `client_event_id` already
 * stored is a repeat, answered with the stored event, when it carries the same
 * event; with anything else it is a conflict (docs/protocol.md, `409`). "The same"
 * is what the Postgres store can tell from its row: the same source and the
 * same payload as jsonb keeps it (the envelope's keys live in columns of their
 * own, the body is JSON round-tripped, jsonb reorders keys). The stores and the
 * gateway all decide it here.
 */

/** Keys of an event's envelope: stored apart, never part of its payload. */
export const EVENT_ENVELOPE_KEYS: readonly string[] = [
  'id',
  'timestamp',
  'source',
  'cause',
  'client_event_id',
  'undone_by',
];

/** What a repeat is compared by. `body` may be a whole stored event: its envelope is ignored. */
export interface EventContent {
  source: string;
  body: object;
}

/** An event body as it is stored and reads back: envelope keys dropped, JSON round-tripped. */
export function storedPayload(body: object): Record<string, unknown> {
  const payload: Record<string, unknown> = { ...body };
  for (const key of EVENT_ENVELOPE_KEYS) delete payload[key];
  return JSON.parse(JSON.stringify(payload)) as Record<string, unknown>;
}

/** Whether `resent` carries the same event as `stored`: same source, same stored payload. */
export function isSameEvent(stored: EventContent, resent: EventContent): boolean {
  return (
    stored.source === resent.source &&
    jsonEqual(storedPayload(stored.body), storedPayload(resent.body))
  );
}

/** Deep equality of JSON values; object key order does not matter (jsonb reorders keys). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    return (
      Array.isArray(a) &&
      Array.isArray(b) &&
      a.length === b.length &&
      a.every((item, i) => jsonEqual(item, b[i]))
    );
  }
  const left = a as Record<string, unknown>;
  const right = b as Record<string, unknown>;
  const keys = Object.keys(left);
  return (
    keys.length === Object.keys(right).length &&
    keys.every((key) => Object.hasOwn(right, key) && jsonEqual(left[key], right[key]))
  );
}
