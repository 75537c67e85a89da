/**
 * Counts prompt tokens with gpt-tokenizer's `o200k_base` encoding (the
 * tokenizer of OpenAI's current models), bundled in the package: nothing is
 * fetched at run time. For other models' tokenizers it is an approximation;
 * operators leave a margin in `LLM_CONTEXT_TOKENS`. The encoding takes about
 * 0.6 s and 70 MB to load, so it is loaded at the first prompt, not at start.
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

let loading: Promise<TokenCounter> | undefined;

export function tokenCounter(): Promise<TokenCounter> {
  loading ??= import('gpt-tokenizer/encoding/o200k_base').then(
    ({ countTokens, decode, encode }) => ({
      count: (text) => (text.length === 0 ? 0 : countTokens(text, PLAIN)),
      truncate: (text, maxTokens) => {
        if (maxTokens <= 0) return '';
        const tokens = encode(text, PLAIN);
        return tokens.length <= maxTokens ? text : decode(tokens.slice(0, maxTokens));
      },
    }),
  );
  return loading;
}
