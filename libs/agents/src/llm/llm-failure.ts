/**
 * What went wrong with one model request, in words safe to show users (no
 * provider text, no key, no URL), whether it is worth retrying, and how long
 * the server asked us to wait. The details go to the logs only, through the
 * `cause` of the turn's error, with the API key scrubbed out.
 */
import { APICallError, InvalidResponseDataError, NoOutputGeneratedError } from 'ai';

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
  if (APICallError.isInstance(error)) {
    const status = error.statusCode;
    const retryAfterMs = retryAfter(error.responseHeaders);
    if (status === 429)
      return failure('the model server is busy (rate limited)', true, retryAfterMs, detail);
    if (status !== undefined && status >= 500) {
      return failure('the model server failed to answer', true, retryAfterMs, detail);
    }
    if (status === 401 || status === 403) {
      return failure('the model server refused the credentials', false, undefined, detail);
    }
    if (status === 408 || status === 409) {
      return failure('the model server did not answer in time', true, retryAfterMs, detail);
    }
    if (status !== undefined && status >= 300) {
      return failure('the model server rejected the request', false, undefined, detail);
    }
    // No status, or 200: the connection failed, or the answer stopped in the middle.
    return error.message.startsWith('Cannot connect')
      ? failure('the model server cannot be reached', true, undefined, detail)
      : failure("the model's answer was cut short", true, undefined, detail);
  }
  if (InvalidResponseDataError.isInstance(error) || NoOutputGeneratedError.isInstance(error)) {
    return failure("the model's answer was cut short", true, undefined, detail);
  }
  if (isStreamErrorEvent(error)) {
    // An error event inside the stream (Anthropic's `overloaded_error`, OpenAI's `error` chunk).
    return failure('the model server failed to answer', true, undefined, detail);
  }
  if (error instanceof TypeError) {
    return failure('the model server cannot be reached', true, undefined, detail);
  }
  return failure('the model server sent an answer that cannot be read', false, undefined, detail);
}

function failure(
  safeMessage: string,
  retryable: boolean,
  retryAfterMs: number | undefined,
  detail: Error,
): LlmFailure {
  return { safeMessage, retryable, retryAfterMs, detail };
}

function isStreamErrorEvent(error: unknown): boolean {
  return typeof error === 'object' && error !== null && !(error instanceof Error);
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
  if (APICallError.isInstance(error)) {
    text = `${error.name}: ${error.message}${error.statusCode ? ` (status ${error.statusCode})` : ''}`;
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
