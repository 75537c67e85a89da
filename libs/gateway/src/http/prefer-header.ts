/**
 * The `Prefer` request header (RFC 7240) as far as this service reads it:
 * `wait=<seconds>` on `POST …/events` (docs/protocol.md "Waiting for an answer
 * over REST"). Preferences are comma-separated (several headers arrive
 * joined by commas), each `token [= word] *(; parameter)`, where a word may
 * be a quoted string that holds commas or semicolons. Preferences this
 * service does not know are ignored, as the RFC asks; of a preference given
 * twice the first counts (RFC 7240 section 2).
 *
 * No npm package parses Prefer strictly and is kept up: this small reader
 * splits on the grammar's separators outside quoted strings only.
 */
import { BadRequestError } from '@cs/core';

export const MIN_WAIT_S = 1;
export const MAX_WAIT_S = 120;

/** The `wait` preference in seconds, or undefined when none was given. */
export function preferredWait(header: string | undefined): number | undefined {
  if (header === undefined) return undefined;
  for (const preference of splitOutsideQuotes(header, ',')) {
    const [head = ''] = splitOutsideQuotes(preference, ';');
    const equals = head.indexOf('=');
    const name = (equals === -1 ? head : head.slice(0, equals)).trim().toLowerCase();
    if (name !== 'wait') continue;
    const raw = equals === -1 ? '' : unquote(head.slice(equals + 1).trim());
    const seconds = /^\d{1,4}$/.test(raw) ? Number(raw) : Number.NaN;
    if (!(seconds >= MIN_WAIT_S && seconds <= MAX_WAIT_S)) {
      throw new BadRequestError(
        `wait must be a whole number of seconds from ${MIN_WAIT_S} to ${MAX_WAIT_S}`,
        'Prefer',
      );
    }
    return seconds;
  }
  return undefined;
}

function unquote(word: string): string {
  if (word.length >= 2 && word.startsWith('"') && word.endsWith('"')) {
    return word.slice(1, -1).replace(/\\(.)/g, '$1');
  }
  return word;
}

/** Splits `text` at `separator` where it is not inside a quoted string. */
function splitOutsideQuotes(text: string, separator: string): string[] {
  const parts: string[] = [];
  let quoted = false;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const char = text[i];
    if (quoted && char === '\\') i++;
    else if (char === '"') quoted = !quoted;
    else if (!quoted && char === separator) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts;
}
