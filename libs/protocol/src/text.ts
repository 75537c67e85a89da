/**
 * Cutting text to a length in UTF-16 code units (JavaScript's `length`)
 * without halving a character: a cut inside a surrogate pair (an emoji, say)
 * would leave a lone surrogate, which Postgres refuses to store in JSON and
 * clients show as U+FFFD.
 */

/** `end`, or one less when the cut at `end` would fall inside a surrogate pair. */
export function wholeCharEnd(text: string, end: number): number {
  if (end <= 0 || end >= text.length) return end;
  const before = text.charCodeAt(end - 1);
  return before >= 0xd800 && before <= 0xdbff ? end - 1 : end;
}

/** At most the first `max` code units of `text`, ending on a whole character. */
export function cutText(text: string, max: number): string {
  return text.length <= max ? text : text.slice(0, wholeCharEnd(text, max));
}
