import { BadRequestException, HttpException, NotFoundException } from '@nestjs/common';
import { describe, expect, it } from 'vitest';
import { mapError } from './error-mapping.js';

/** An error as body-parser raises it (http-errors with a `type`). */
const parserError = (status: number, type: string) =>
  Object.assign(new Error(type), { status, statusCode: status, type, expose: true });

/** The same error as Nest hands it to the filter (ExpressAdapter.mapException). */
const wrapped = (status: number, type: string) =>
  new HttpException(type, status, { cause: parserError(status, type) });

describe(mapError.name, () => {
  it('maps every body-parser refusal but 413 to 400 BAD_REQUEST (the contract has no 415)', () => {
    for (const error of [
      parserError(415, 'charset.unsupported'),
      wrapped(415, 'charset.unsupported'),
    ]) {
      expect(mapError(error)).toEqual({
        status: 400,
        body: { error: { code: 'BAD_REQUEST', message: 'the body must be JSON in UTF-8' } },
        headers: {},
      });
    }
    for (const [status, type] of [
      [415, 'encoding.unsupported'],
      [400, 'request.aborted'],
      [400, 'request.size.invalid'],
      [403, 'entity.verify.failed'],
      [400, 'entity.parse.failed'],
    ] as const) {
      for (const error of [parserError(status, type), wrapped(status, type)]) {
        expect(mapError(error), type).toMatchObject({
          status: 400,
          body: { error: { code: 'BAD_REQUEST', message: expect.any(String) } },
        });
      }
    }
    for (const error of [parserError(413, 'entity.too.large'), wrapped(413, 'entity.too.large')]) {
      expect(mapError(error)).toMatchObject({
        status: 413,
        body: { error: { code: 'PAYLOAD_TOO_LARGE' } },
      });
    }
  });

  it("keeps another error's status when the contract has it, else 400 (or 500)", () => {
    expect(mapError(new NotFoundException('secret path'))).toEqual({
      status: 404,
      body: { error: { code: 'NOT_FOUND', message: 'not found' } },
      headers: {},
    });
    expect(mapError(new BadRequestException('limit is too big'))).toMatchObject({
      status: 400,
      body: { error: { code: 'BAD_REQUEST', message: 'limit is too big' } },
    });
    expect(mapError(new HttpException('unsupported media type', 415))).toMatchObject({
      status: 400,
      body: { error: { code: 'BAD_REQUEST' } },
    });
    expect(mapError({ status: 404 })).toMatchObject({
      status: 404,
      body: { error: { code: 'NOT_FOUND' } },
    });
    expect(mapError({ status: 405 })).toMatchObject({
      status: 400,
      body: { error: { code: 'BAD_REQUEST' } },
    });
    expect(mapError(new Error('boom'))).toEqual({
      status: 500,
      body: { error: { code: 'UNAVAILABLE', message: 'internal error' } },
      headers: {},
    });
  });
});
