import { MAX_FALLBACK_TITLE_CHARS, cutText } from '@cs/protocol';

/**
 * The fallback title of docs/protocol.md "Titles": the first user message,
 * cut at a word boundary.
 */
export function fallbackTitle(firstMessage: string): string {
  const text = firstMessage.replace(/\s+/g, ' ').trim();
  if (text.length <= MAX_FALLBACK_TITLE_CHARS) return text;
  const cut = text.slice(0, MAX_FALLBACK_TITLE_CHARS + 1);
  const boundary = cut.lastIndexOf(' ');
  return boundary > 0 ? cut.slice(0, boundary).trimEnd() : cutText(text, MAX_FALLBACK_TITLE_CHARS);
}
