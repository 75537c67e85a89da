/**
 * How deep and how large untrusted JSON may be (docs/protocol.md, "Limits").
 * Everything that recurses over a value (JSON.stringify, deep equality,
 * Postgres' jsonb input) fails with a RangeError or a stack-depth error a few
 * thousand levels down, so deeper values are refused before anything touches
 * them. The walk is iterative and stops at the first container past the
 * limit: a 1 MiB body nested half a million deep costs no stack, and nothing
 * below the limit is looked at.
 *
 * Depth counts containers: a primitive is 0 deep, `{}` and `[]` are 1 deep,
 * `{"a":{}}` is 2 deep. A REST body or a socket payload is one JSON document,
 * so its own braces count.
 */
import { z } from 'zod';
import { MAX_JSON_DEPTH } from './limits.js';

type PathKey = string | number;

interface PendingContainer {
  value: object;
  depth: number;
  key: PathKey | undefined;
  parent: PendingContainer | undefined;
}

/**
 * The path (keys and indexes from the top) to the first container nested
 * deeper than `max`, or undefined when there is none. Values from
 * `JSON.parse` are trees; a cyclic object ends here too, as one too deep.
 */
export function findJsonTooDeep(
  value: unknown,
  max: number = MAX_JSON_DEPTH,
): PathKey[] | undefined {
  if (!isContainer(value)) return undefined;
  const stack: PendingContainer[] = [{ value, depth: 1, key: undefined, parent: undefined }];
  for (let entry = stack.pop(); entry !== undefined; entry = stack.pop()) {
    if (entry.depth > max) return pathOf(entry);
    const children: Array<[PathKey, unknown]> = Array.isArray(entry.value)
      ? entry.value.map((child: unknown, index) => [index, child])
      : Object.entries(entry.value);
    for (const [key, child] of children) {
      if (isContainer(child)) {
        stack.push({ value: child, depth: entry.depth + 1, key, parent: entry });
      }
    }
  }
  return undefined;
}

/**
 * The path to the first string (a value or a key) Postgres cannot store as
 * it is: one holding NUL, which text and jsonb refuse, or an unpaired
 * surrogate, which jsonb refuses. Undefined when there is none. Iterative,
 * for values already found within the depth limit.
 */
export function findUnstorableText(value: unknown): PathKey[] | undefined {
  if (typeof value === 'string') return isStorableText(value) ? undefined : [];
  if (!isContainer(value)) return undefined;
  const stack: PendingContainer[] = [{ value, depth: 1, key: undefined, parent: undefined }];
  for (let entry = stack.pop(); entry !== undefined; entry = stack.pop()) {
    const children: Array<[PathKey, unknown]> = Array.isArray(entry.value)
      ? entry.value.map((child: unknown, index) => [index, child])
      : Object.entries(entry.value);
    for (const [key, child] of children) {
      const at = { value: {}, depth: entry.depth + 1, key, parent: entry };
      if (typeof key === 'string' && !isStorableText(key)) return pathOf(at);
      if (typeof child === 'string' && !isStorableText(child)) return pathOf(at);
      if (isContainer(child)) stack.push({ ...at, value: child });
    }
  }
  return undefined;
}

const UNPAIRED_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Whether Postgres stores `text` as it is (no NUL, no unpaired surrogate). */
/** `text` without what Postgres cannot store: NULs and unpaired surrogates are removed. */
export function storableText(text: string): string {
  return isStorableText(text)
    ? text
    : text.replaceAll('\u0000', '').replace(new RegExp(UNPAIRED_SURROGATE.source, 'g'), '');
}

export function isStorableText(text: string): boolean {
  return !text.includes('\u0000') && !UNPAIRED_SURROGATE.test(text);
}

/** True when no container in `value` is nested deeper than `max`. */
export function jsonDepthWithin(value: unknown, max: number = MAX_JSON_DEPTH): boolean {
  return findJsonTooDeep(value, max) === undefined;
}

/**
 * The UTF-8 bytes of `JSON.stringify(value)`. JSON.stringify recurses: call
 * it only on values found within the depth limit.
 */
export function jsonByteLength(value: unknown): number {
  const text = JSON.stringify(value) ?? '';
  return new TextEncoder().encode(text).length;
}

function isContainer(value: unknown): value is object {
  return typeof value === 'object' && value !== null;
}

function pathOf(entry: PendingContainer): PathKey[] {
  const path: PathKey[] = [];
  for (let at: PendingContainer | undefined = entry; at?.key !== undefined; at = at.parent) {
    path.push(at.key);
  }
  return path.reverse();
}

/**
 * `schema` for a JSON object that must not have the own key `__proto__`: zod
 * copies a record's keys into a new object, where that key sets the
 * prototype instead, so it was dropped without a word. Refused instead, as a
 * field of its own (`metadata.__proto__`). Deeper objects are kept as sent.
 */
export function withoutProtoKey<T extends z.ZodType>(schema: T) {
  return z.preprocess((value, ctx) => {
    if (typeof value === 'object' && value !== null && Object.hasOwn(value, '__proto__')) {
      ctx.addIssue({
        code: 'custom',
        message: 'the key __proto__ is not allowed',
        path: ['__proto__'],
        input: value,
      });
    }
    return value;
  }, schema);
}
