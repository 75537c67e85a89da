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
 */

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
      count: (text) => (text.length === 0 ? 0 : cached(text, (t) => countTokens(t, PLAIN))),
      truncate: (text, maxTokens) => {
        if (maxTokens <= 0) return '';
        const tokens = encode(text, PLAIN);
        return tokens.length <= maxTokens ? text : decode(tokens.slice(0, maxTokens));
      },
    }),
  );
  return loading;
}
