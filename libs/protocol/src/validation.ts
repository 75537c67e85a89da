import type { z } from 'zod';

/** The first problem of a failed parse, as `{ field, message }` (field as a dotted path). */
export interface ValidationProblem {
  field?: string;
  message: string;
}

export function describeZodError(error: z.ZodError): ValidationProblem {
  const issue = error.issues[0];
  if (!issue) return { message: 'invalid input' };
  // An unknown key is reported on its parent; name the key itself.
  const keys = issue.code === 'unrecognized_keys' ? issue.keys : [];
  const path = [...issue.path, ...keys.slice(0, 1)].map(String);
  const field = path.length > 0 ? path.join('.') : undefined;
  const message =
    issue.code === 'unrecognized_keys'
      ? `unknown field ${field ?? ''}`.trim()
      : field
        ? `${field}: ${issue.message}`
        : issue.message;
  return field === undefined ? { message } : { field, message };
}
