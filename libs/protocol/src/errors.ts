import { z } from 'zod';

/** Error codes of the contract, with the HTTP status each one maps to. */
export const ERROR_HTTP_STATUS = {
  BAD_REQUEST: 400,
  UNAUTHORIZED: 401,
  NOT_FOUND: 404,
  CONFLICT: 409,
  /** A message refused by the `reject` strategy while a turn runs. */
  AGENT_BUSY: 409,
  PAYLOAD_TOO_LARGE: 413,
  RATE_LIMITED: 429,
  CONCURRENCY_LIMIT_REACHED: 429,
  UNAVAILABLE: 503,
} as const;

export type ErrorCode = keyof typeof ERROR_HTTP_STATUS;
export const ERROR_CODES = Object.keys(ERROR_HTTP_STATUS) as ErrorCode[];
export const ErrorCodeSchema = z.enum(ERROR_CODES as [ErrorCode, ...ErrorCode[]]);

export const ErrorDetailSchema = z.object({
  code: ErrorCodeSchema,
  message: z.string(),
  field: z.string().optional(),
});
export type ErrorDetail = z.infer<typeof ErrorDetailSchema>;

/** The body of every REST error: `{ error: { code, message, field? } }`. */
export const ErrorBodySchema = z.object({ error: ErrorDetailSchema });
export type ErrorBody = z.infer<typeof ErrorBodySchema>;
