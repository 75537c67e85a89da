import { HttpException } from '@nestjs/common';
import { DomainError, RateLimitedError } from '@cs/core';
import { ERROR_HTTP_STATUS, type ErrorBody, type ErrorCode } from '@cs/protocol';

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

/**
 * The one place where errors become `{ error: { code, message, field? } }`.
 * Unknown errors become a bare 500 message: no stack trace or SQL text leaves.
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
  if (error instanceof HttpException) {
    const status = error.getStatus();
    const code = STATUS_CODES[status] ?? (status >= 500 ? 'UNAVAILABLE' : 'BAD_REQUEST');
    const message = status === 404 ? 'not found' : httpMessage(error);
    return { status, body: { error: { code, message } }, headers: {} };
  }
  const transport = error as TransportError | null;
  if (transport && typeof transport === 'object') {
    if (transport.type === 'entity.too.large') {
      return body(413, 'PAYLOAD_TOO_LARGE', 'the request body is larger than 1 MiB');
    }
    if (transport.type === 'entity.parse.failed') {
      return body(400, 'BAD_REQUEST', 'the request body is not valid JSON');
    }
    const status = transport.status ?? transport.statusCode;
    if (typeof status === 'number' && status >= 400 && status < 500) {
      return body(status, STATUS_CODES[status] ?? 'BAD_REQUEST', 'the request could not be read');
    }
  }
  return body(500, 'UNAVAILABLE', 'internal error');
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
