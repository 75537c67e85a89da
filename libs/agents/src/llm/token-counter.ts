/**
 * Counts prompt tokens with gpt-tokenizer's `o200k_base` encoding (the
 * tokenizer of OpenAI's current models), bundled in the package: nothing is
 * fetched at run time. For other models' tokenizers it is an approximation;
 * operators leave a margin in `LLM_CONTEXT_TOKENS`.
 */
import { countTokens, decode, encode } from 'gpt-tokenizer/encoding/o200k_base';

// Text from users and tools may hold special-token strings (`<|endoftext|>`):
// they count as plain text, never as control tokens (the default throws).
const PLAIN = { disallowedSpecial: new Set<string>() };

/** Tokens a chat message costs besides its text (role and separators), as OpenAI counts them. */
export const MESSAGE_OVERHEAD_TOKENS = 4;

export function countTextTokens(text: string): number {
  return text.length === 0 ? 0 : countTokens(text, PLAIN);
}

/** The longest prefix of `text` that is at most `maxTokens` tokens. */
export function truncateToTokens(text: string, maxTokens: number): string {
  if (maxTokens <= 0) return '';
  const tokens = encode(text, PLAIN);
  if (tokens.length <= maxTokens) return text;
  return decode(tokens.slice(0, maxTokens));
}
