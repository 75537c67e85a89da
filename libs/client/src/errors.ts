import type { ErrorCode } from './wire.js';

/**
 * Every failure of the SDK: `code` is one of the contract's error codes
 * (`UNAVAILABLE` when the service could not be reached), `status` the HTTP
 * status when there was a response, `field` the offending field when one was
 * at fault (a dotted path, e.g. `args.content`).
 */
export class ConversationServiceError extends Error {
  override readonly name = 'ConversationServiceError';
  readonly code: ErrorCode;
  readonly status: number | undefined;
  readonly field: string | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options: { status?: number; field?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.status = options.status;
    this.field = options.field;
  }
}

/** The code a bare HTTP status stands for, when the body did not say. */
export function codeForStatus(status: number): ErrorCode {
  switch (status) {
    case 400:
      return 'BAD_REQUEST';
    case 401:
      return 'UNAUTHORIZED';
    case 404:
      return 'NOT_FOUND';
    case 409:
      return 'CONFLICT';
    case 413:
      return 'PAYLOAD_TOO_LARGE';
    case 429:
      return 'RATE_LIMITED';
    default:
      return 'UNAVAILABLE';
  }
}
