/**
 * Counts prompt tokens with gpt-tokenizer's `o200k_base` encoding (the
 * tokenizer of OpenAI's current models), bundled in the package: nothing is
 * fetched at run time. For other models' tokenizers it is an approximation;
 * operators leave a margin in `LLM_CONTEXT_TOKENS`. The encoding takes about
 * 0.6 s and 70 MB to load, so it is loaded at the first prompt, not at start.
 *
 * Every step counts the history it sends again, so counts of longer texts
 * are remembered (by text, a bounded number of them, least recently used
 * first out): a step then counts only what is new since the last one.
 *
 * Byte-pair encoding costs the square of the length of each run the
 * tokenizer does not split (a word, a run of spaces, a text in Chinese or
 * Japanese, which has no spaces): measured here, 16,000 CJK characters took
 * 2.4 s and 16,000 spaces 0.4 s, so that one message could stall a worker for
 * minutes. Texts are therefore encoded in pieces of at most `PIECE_CHARS`,
 * cut before a space where there is one (where the tokenizer starts a token
 * anyway: ordinary prose counts exactly as whole) and elsewhere at a character
 * boundary (a count then a little above the whole text's): 1 MiB of CJK costs
 * about 50 ms.
 */

import { wholeCharEnd } from '@cs/protocol';

export interface TokenCounter {
  count(text: string): number;
  /** The longest prefix of `text` that is at most `maxTokens` tokens. */
  truncate(text: string, maxTokens: number): string;
}

/** Tokens a chat message costs besides its text (role and separators), as OpenAI counts them. */
export const MESSAGE_OVERHEAD_TOKENS = 4;

// Text from users and tools may hold special-token strings (`<|endoftext|>`):
// they count as plain text, never as control tokens (the default throws).
const PLAIN = { disallowedSpecial: new Set<string>() };

/** Texts shorter than this are counted each time; longer than the second, too (rare, and big to keep). */
const CACHED_MIN_CHARS = 64;
const CACHED_MAX_CHARS = 64 * 1024;
/** Counts remembered, process-wide. */
export const TOKEN_COUNT_CACHE_SIZE = 4096;

const counts = new Map<string, number>();

/** The longest piece encoded at once (see above). */
export const PIECE_CHARS = 256;

/** `text` cut into pieces of at most `PIECE_CHARS`, before a space where the window has one. */
export function piecesOf(text: string): string[] {
  const pieces: string[] = [];
  let start = 0;
  while (text.length - start > PIECE_CHARS) {
    const cut =
      lastSpaceIn(text, start, start + PIECE_CHARS) ?? wholeCharEnd(text, start + PIECE_CHARS);
    pieces.push(text.slice(start, cut));
    start = cut;
  }
  pieces.push(text.slice(start));
  return pieces;
}

/**
 * The index of the last space in (`after`, `end`], looked for in that window
 * only (`lastIndexOf` would scan back to the start of the text: a long text
 * without spaces would cost the square of its length again).
 */
function lastSpaceIn(text: string, after: number, end: number): number | undefined {
  for (let at = end; at > after; at -= 1) if (text.charCodeAt(at) === 32) return at;
  return undefined;
}

function cached(text: string, count: (text: string) => number): number {
  if (text.length < CACHED_MIN_CHARS || text.length > CACHED_MAX_CHARS) return count(text);
  const known = counts.get(text);
  if (known !== undefined) {
    // Most recently used last.
    counts.delete(text);
    counts.set(text, known);
    return known;
  }
  const tokens = count(text);
  counts.set(text, tokens);
  if (counts.size > TOKEN_COUNT_CACHE_SIZE) counts.delete(counts.keys().next().value as string);
  return tokens;
}

/** How many counts are remembered now (at most `TOKEN_COUNT_CACHE_SIZE`). */
export function rememberedTokenCounts(): number {
  return counts.size;
}

let loading: Promise<TokenCounter> | undefined;

export function tokenCounter(): Promise<TokenCounter> {
  loading ??= import('gpt-tokenizer/encoding/o200k_base').then(
    ({ countTokens, decode, encode }) => ({
      count: (text) =>
        text.length === 0
          ? 0
          : cached(text, (t) => piecesOf(t).reduce((sum, p) => sum + countTokens(p, PLAIN), 0)),
      truncate: (text, maxTokens) => {
        let kept = '';
        let room = maxTokens;
        for (const piece of piecesOf(text)) {
          if (room <= 0) break;
          const tokens = encode(piece, PLAIN);
          if (tokens.length > room) return kept + decode(tokens.slice(0, room));
          kept += piece;
          room -= tokens.length;
        }
        return kept;
      },
    }),
  );
  return loading;
}
