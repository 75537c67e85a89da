import type { ApiBodyOptions } from '@nestjs/swagger';
import { z } from 'zod';

type SchemaObject = NonNullable<Extract<ApiBodyOptions, { schema?: unknown }>['schema']>;

/** The OpenAPI schema of a request body, generated from its zod schema (one source of truth). */
export function openApiSchema(schema: z.ZodType): SchemaObject {
  const json = z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' }) as Record<
    string,
    unknown
  >;
  delete json.$schema;
  return json;
}
