import { describe, expect, it } from 'vitest';
import {
  findJsonTooDeep,
  findUnstorableText,
  isStorableText,
  jsonByteLength,
  jsonDepthWithin,
} from './json-limits.js';
import { MAX_JSON_DEPTH } from './limits.js';

/** `{"a":{"a":…{}}}` with `depth` levels of braces. */
function nestedObjects(depth: number): unknown {
  let value: unknown = {};
  for (let level = 1; level < depth; level += 1) value = { a: value };
  return value;
}

/** `[[…[]]]` with `depth` levels of brackets, parsed from text as a body would be. */
function nestedArrays(depth: number): unknown {
  return JSON.parse(`${'['.repeat(depth)}${']'.repeat(depth)}`);
}

describe('jsonDepthWithin', () => {
  it('counts containers: primitives are 0 deep, {} and [] are 1 deep', () => {
    for (const primitive of [null, 1, 'text', true, undefined]) {
      expect(jsonDepthWithin(primitive, 0)).toBe(true);
    }
    expect(jsonDepthWithin({}, 0)).toBe(false);
    expect(jsonDepthWithin({}, 1)).toBe(true);
    expect(jsonDepthWithin([], 1)).toBe(true);
    expect(jsonDepthWithin({ a: [1, { b: 'x' }] }, 2)).toBe(false);
    expect(jsonDepthWithin({ a: [1, { b: 'x' }] }, 3)).toBe(true);
  });

  it('accepts MAX_JSON_DEPTH levels and refuses one more', () => {
    expect(MAX_JSON_DEPTH).toBe(32);
    expect(jsonDepthWithin(nestedObjects(MAX_JSON_DEPTH))).toBe(true);
    expect(jsonDepthWithin(nestedObjects(MAX_JSON_DEPTH + 1))).toBe(false);
    expect(jsonDepthWithin(nestedArrays(MAX_JSON_DEPTH))).toBe(true);
    expect(jsonDepthWithin(nestedArrays(MAX_JSON_DEPTH + 1))).toBe(false);
  });

  it('finds a too-deep branch beside shallow ones, wherever it is', () => {
    // 31 levels: at the limit as a field of an object, past it one level further down.
    const deep = nestedObjects(MAX_JSON_DEPTH - 1);
    expect(jsonDepthWithin({ first: 1, second: [{}, {}], third: { deep } })).toBe(false);
    expect(jsonDepthWithin([[], [[], [deep]]])).toBe(false);
    expect(jsonDepthWithin({ first: deep, second: deep })).toBe(true);
  });

  it('walks without recursion: half a million levels (a 1 MiB body) do not throw', () => {
    const value = nestedArrays(500_000);
    // The recursive walk JSON.stringify does fails on this.
    expect(() => JSON.stringify(value)).toThrow(RangeError);
    expect(jsonDepthWithin(value)).toBe(false);
  });

  it('stops at the first container past the limit, reading nothing inside it', () => {
    const trap = {};
    Object.defineProperty(trap, 'inside', {
      enumerable: true,
      get() {
        throw new Error('read past the limit');
      },
    });
    let value: unknown = trap;
    for (let level = 0; level < MAX_JSON_DEPTH; level += 1) value = { a: value };
    // The trap is the 33rd level: found too deep, never looked into.
    expect(findJsonTooDeep(value)).toHaveLength(MAX_JSON_DEPTH);
    expect(() => findJsonTooDeep({ a: trap }, 1)).not.toThrow();
    expect(() => findJsonTooDeep({ a: trap }, 2)).toThrow('read past the limit');
  });
});

describe('findJsonTooDeep', () => {
  it('gives the path to the first container past the limit', () => {
    expect(findJsonTooDeep({ a: 1, b: { c: [0, {}] } }, 2)).toEqual(['b', 'c']);
    expect(findJsonTooDeep({ a: 1, b: { c: [0, {}] } }, 3)).toEqual(['b', 'c', 1]);
    expect(findJsonTooDeep({ a: 1, b: { c: [0, {}] } }, 4)).toBeUndefined();
    expect(findJsonTooDeep({ metadata: nestedObjects(5_000) })?.slice(0, 2)).toEqual([
      'metadata',
      'a',
    ]);
    expect(findJsonTooDeep({ metadata: nestedObjects(5_000) })).toHaveLength(MAX_JSON_DEPTH);
  });
});

describe('jsonByteLength', () => {
  it('counts the UTF-8 bytes of the JSON text', () => {
    expect(jsonByteLength({ a: 'x' })).toBe('{"a":"x"}'.length);
    // é is 2 bytes, € 3, 😀 (a surrogate pair) 4.
    expect(jsonByteLength('é€😀')).toBe(2 + 2 + 3 + 4);
    expect(jsonByteLength(undefined)).toBe(0);
  });
});

describe('findUnstorableText', () => {
  it('finds the first string or key holding NUL or an unpaired surrogate, by its path', () => {
    expect(findUnstorableText({ a: 'fine 😀', b: [1, 'ok'] })).toBeUndefined();
    expect(findUnstorableText({ a: { b: ['x', 'y\u0000'] } })).toEqual(['a', 'b', 1]);
    expect(findUnstorableText({ note: 'half \ud83d' })).toEqual(['note']);
    expect(findUnstorableText({ meta: { ['k\u0000']: 1 } })).toEqual(['meta', 'k\u0000']);
    expect(findUnstorableText('\udc00')).toEqual([]);
    expect(findUnstorableText(42)).toBeUndefined();
  });

  it('tells storable text: pairs are fine, halves are not', () => {
    expect(isStorableText('😀')).toBe(true);
    expect(isStorableText('\ud83d')).toBe(false);
    expect(isStorableText('\ude00x')).toBe(false);
    expect(isStorableText('a\u0000')).toBe(false);
  });
});
