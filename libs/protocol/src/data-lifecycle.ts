import { z } from 'zod';
import { DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT } from './limits.js';

/** docs/protocol.md "Data lifecycle": erasure, export and audit on the wire. */

/** The user id that stands for an erased user in what is kept (usage rows, audit records). */
export const ERASED_USER = 'erased';

const queryLimit = z
  .string()
  .regex(/^\d{1,16}$/, 'must be an integer')
  .transform(Number)
  .pipe(z.number().int().min(1).max(MAX_PAGE_LIMIT));

/** `GET /api/audit?limit=&page_id=`. */
export const AuditQuerySchema = z.object({
  limit: queryLimit.default(DEFAULT_PAGE_LIMIT),
  /** The previous page's `next_page_id`; the store checks it. */
  page_id: z.string().min(1).max(32).optional(),
});
export type AuditQuery = z.infer<typeof AuditQuerySchema>;

export const AuditRecordSchema = z.object({
  id: z.string(),
  time: z.string(),
  actor: z.string(),
  action: z.string(),
  target: z.string(),
});
export type AuditRecordView = z.infer<typeof AuditRecordSchema>;

export const AuditPageSchema = z.object({
  results: z.array(AuditRecordSchema),
  next_page_id: z.string().nullable(),
});
export type AuditPageView = z.infer<typeof AuditPageSchema>;

/** `DELETE /api/users/:user_id` → 202. */
export const ErasureStartedSchema = z.object({ erasure_id: z.string() });
export type ErasureStarted = z.infer<typeof ErasureStartedSchema>;

/** `GET /api/erasures/:erasure_id`. */
export const ErasureStatusSchema = z.object({
  status: z.enum(['running', 'done']),
  conversations_deleted: z.number().int().min(0),
});
export type ErasureStatusView = z.infer<typeof ErasureStatusSchema>;

/** A user id in a path: any non-empty id a token's `sub` may hold; `me` is the caller. */
export const UserIdParamSchema = z.string().min(1).max(1024);
