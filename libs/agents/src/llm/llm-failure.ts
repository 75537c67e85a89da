/**
 * What went wrong with one model request, in words safe to show users (no
 * provider text, no key, no URL), whether it is worth retrying, and how long
 * the server asked us to wait. The details go to the logs only, through the
 * `cause` of the turn's error, with the API key scrubbed out.
 */
import { ModelRequestError } from './model-client.js';

export interface LlmFailure {
  /** Shown to users (the turn's `error` observation). */
  safeMessage: string;
  retryable: boolean;
  /** From `retry-after-ms` / `retry-after`, when the server sent one. */
  retryAfterMs: number | undefined;
  /** For the logs: status, error name and message, the key scrubbed. */
  detail: Error;
}

/** The longest `retry-after` honoured; a longer one is cut to it. */
export const MAX_RETRY_AFTER_MS = 60_000;

export function classifyLlmFailure(
  error: unknown,
  { timedOut, secrets }: { timedOut: boolean; secrets: readonly (string | undefined)[] },
): LlmFailure {
  const detail = scrubbedError(error, secrets);
  if (timedOut) {
    return failure('the model request timed out', true, undefined, detail);
  }
  if (!(error instanceof ModelRequestError)) {
    return failure('the model server sent an answer that cannot be read', false, undefined, detail);
  }
  switch (error.kind) {
    case 'status':
      return statusFailure(error.status!, retryAfter(error.headers), detail);
    case 'connection':
      return failure('the model server cannot be reached', true, undefined, detail);
    case 'cut':
      return failure("the model's answer was cut short", true, undefined, detail);
    case 'stream-error':
      // An error inside the stream (Anthropic's `overloaded_error`, OpenAI's `error` chunk).
      return failure('the model server failed to answer', true, undefined, detail);
    case 'unreadable':
      return failure(
        'the model server sent an answer that cannot be read',
        false,
        undefined,
        detail,
      );
  }
}

function statusFailure(
  status: number,
  retryAfterMs: number | undefined,
  detail: Error,
): LlmFailure {
  if (status === 429) {
    return failure('the model server is busy (rate limited)', true, retryAfterMs, detail);
  }
  if (status >= 500)
    return failure('the model server failed to answer', true, retryAfterMs, detail);
  if (status === 401 || status === 403) {
    return failure('the model server refused the credentials', false, undefined, detail);
  }
  if (status === 408 || status === 409) {
    return failure('the model server did not answer in time', true, retryAfterMs, detail);
  }
  return failure('the model server rejected the request', false, undefined, detail);
}

function failure(
  safeMessage: string,
  retryable: boolean,
  retryAfterMs: number | undefined,
  detail: Error,
): LlmFailure {
  return { safeMessage, retryable, retryAfterMs, detail };
}

/** `retry-after-ms` (OpenAI), else `retry-after` in seconds or as an HTTP date. */
export function retryAfter(
  headers: Record<string, string> | undefined,
  now = Date.now(),
): number | undefined {
  if (!headers) return undefined;
  const lower = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
  const ms = Number(lower['retry-after-ms']);
  if (lower['retry-after-ms'] !== undefined && Number.isFinite(ms) && ms >= 0) {
    return Math.min(ms, MAX_RETRY_AFTER_MS);
  }
  const value = lower['retry-after'];
  if (value === undefined || value.trim() === '') return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds) && seconds >= 0) return Math.min(seconds * 1000, MAX_RETRY_AFTER_MS);
  const date = Date.parse(value);
  if (Number.isNaN(date)) return undefined;
  return Math.min(Math.max(0, date - now), MAX_RETRY_AFTER_MS);
}

/** An Error for the logs saying what happened, with every secret replaced by `***`. */
export function scrubbedError(error: unknown, secrets: readonly (string | undefined)[]): Error {
  let text: string;
  if (error instanceof ModelRequestError) {
    text = `${error.name} (${error.kind}${error.status ? ` ${error.status}` : ''}): ${error.message}`;
  } else if (error instanceof Error) {
    text = `${error.name}: ${error.message}`;
  } else {
    try {
      text = JSON.stringify(error) ?? String(error);
    } catch {
      text = String(error);
    }
  }
  return new Error(scrub(text.slice(0, 2000), secrets));
}

export function scrub(text: string, secrets: readonly (string | undefined)[]): string {
  let out = text;
  for (const secret of secrets) {
    if (secret && secret.length >= 4) out = out.split(secret).join('***');
  }
  return out;
}
