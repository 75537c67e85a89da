/**
 * The opaque `page_id` of conversation lists: the last row's activity time in
 * microseconds (a JS Date would round it to milliseconds and repeat or skip
 * rows that share one) and its id, as base64url JSON.
 */
import { BadRequestError } from '@cs/core';
import type { ListPosition } from './repositories/conversation.repository.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
// Microseconds since 1970, as Postgres prints a non-negative bigint: no sign,
// no leading zero, at most 18 digits (year 33658), so that the query's
// timestamp arithmetic stays in range. A negative one overflowed it (a 500).
const MICROS = /^(?:0|[1-9]\d{0,17})$/;

export function isUuid(value: string): boolean {
  return UUID.test(value);
}

export function encodeCursor(position: ListPosition): string {
  return Buffer.from(JSON.stringify([position.updatedAtMicros, position.id])).toString('base64url');
}

export function decodeCursor(cursor: string): ListPosition {
  const invalid = () => new BadRequestError('invalid page_id', 'page_id');
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    throw invalid();
  }
  if (
    !Array.isArray(parsed) ||
    parsed.length !== 2 ||
    typeof parsed[0] !== 'string' ||
    typeof parsed[1] !== 'string' ||
    !MICROS.test(parsed[0]) ||
    !isUuid(parsed[1]) ||
    // Ids come out of Postgres in lower case; no other spelling is a cursor it made.
    parsed[1] !== parsed[1].toLowerCase()
  ) {
    throw invalid();
  }
  const position = { updatedAtMicros: parsed[0], id: parsed[1] };
  // Node's base64url decoder skips stray characters: only the canonical text is a cursor.
  if (encodeCursor(position) !== cursor) throw invalid();
  return position;
}
