import { HttpException } from '@nestjs/common';
import { DomainError, RateLimitedError } from '@cs/core';
import { ERROR_HTTP_STATUS, type ErrorBody, type ErrorCode } from '@cs/protocol';
import {
  INFRASTRUCTURE_UNAVAILABLE_MESSAGE,
  isInfrastructureUnavailable,
} from './infrastructure-errors.js';

export interface MappedError {
  status: number;
  body: ErrorBody;
  /** Response headers the error asks for (`Retry-After` of a rate limit). */
  headers: Record<string, string>;
}

/** Body-parser and Express errors carry a `type` and a `status`. */
interface TransportError {
  type?: string;
  status?: number;
  statusCode?: number;
}

const STATUS_CODES: Record<number, ErrorCode> = {
  400: 'BAD_REQUEST',
  401: 'UNAUTHORIZED',
  404: 'NOT_FOUND',
  409: 'CONFLICT',
  413: 'PAYLOAD_TOO_LARGE',
  429: 'RATE_LIMITED',
  503: 'UNAVAILABLE',
};

/** What the body parser's refusals (by their `type`) tell the client. */
const UNREADABLE = new Map([
  ['entity.parse.failed', 'the request body is not valid JSON'],
  ['charset.unsupported', 'the body must be JSON in UTF-8'],
  ['encoding.unsupported', 'the body has a content-encoding the service does not read'],
]);

/**
 * The one place where errors become `{ error: { code, message, field? } }`.
 * Postgres or Redis out of reach is a 503; other unknown errors (bugs) become
 * a bare 500 message: no stack trace or SQL text leaves.
 * Only the contract's statuses leave: any other 4xx is a 400 `BAD_REQUEST`.
 */
export function mapError(error: unknown): MappedError {
  if (error instanceof DomainError) {
    const detail = { code: error.code, message: error.message };
    const retryAfter = error instanceof RateLimitedError ? error.retryAfterSeconds : null;
    return {
      status: ERROR_HTTP_STATUS[error.code],
      body: { error: error.field === undefined ? detail : { ...detail, field: error.field } },
      headers: retryAfter === null ? {} : { 'Retry-After': String(retryAfter) },
    };
  }
  // Nest hands the body parser's errors to filters wrapped in an HttpException.
  const refusal = bodyParserRefusal(error instanceof HttpException ? error.cause : error);
  if (refusal === 'entity.too.large') {
    return body(413, 'PAYLOAD_TOO_LARGE', 'the request body is larger than 1 MiB');
  }
  if (refusal !== undefined) {
    // However the parser says it (a 415 for a charset it does not know), an unreadable body is a 400.
    return body(
      400,
      'BAD_REQUEST',
      UNREADABLE.get(refusal) ?? 'the request body could not be read',
    );
  }
  if (error instanceof HttpException) {
    const status = error.getStatus();
    if (status >= 500) {
      return body(status, STATUS_CODES[status] ?? 'UNAVAILABLE', httpMessage(error));
    }
    return clientError(status, status === 404 ? 'not found' : httpMessage(error));
  }
  const transport = error as TransportError | null;
  const status = transport?.status ?? transport?.statusCode;
  if (typeof status === 'number' && status >= 400 && status < 500) {
    return clientError(status, 'the request could not be read');
  }
  if (isInfrastructureUnavailable(error)) {
    return body(503, 'UNAVAILABLE', INFRASTRUCTURE_UNAVAILABLE_MESSAGE);
  }
  return body(500, 'UNAVAILABLE', 'internal error');
}

/** The `type` of a body parser's refusal (an http-errors 4xx that has one). */
function bodyParserRefusal(error: unknown): string | undefined {
  const candidate = error as TransportError | null | undefined;
  if (typeof candidate?.type !== 'string') return undefined;
  const status = candidate.status ?? candidate.statusCode ?? 0;
  return status >= 400 && status < 500 ? candidate.type : undefined;
}

/** A 4xx as the contract has it: its own status and code, or 400 `BAD_REQUEST`. */
function clientError(status: number, message: string): MappedError {
  const code = STATUS_CODES[status];
  return code ? body(status, code, message) : body(400, 'BAD_REQUEST', message);
}

function body(status: number, code: ErrorCode, message: string): MappedError {
  return { status, body: { error: { code, message } }, headers: {} };
}

function httpMessage(error: HttpException): string {
  const response = error.getResponse();
  if (typeof response === 'string') return response;
  const message = (response as { message?: unknown }).message;
  if (typeof message === 'string') return message;
  if (Array.isArray(message) && typeof message[0] === 'string') return message[0];
  return error.message;
}
