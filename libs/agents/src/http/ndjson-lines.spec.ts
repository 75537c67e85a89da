import { describe, expect, it } from 'vitest';
import { NdjsonLines } from './ndjson-lines.js';

describe(NdjsonLines.name, () => {
  it('returns the lines each chunk completes and keeps the rest for the next', () => {
    const lines = new NdjsonLines();
    expect(lines.push('{"a":1}\n{"b"')).toEqual(['{"a":1}']);
    expect(lines.push(':2')).toEqual([]);
    expect(lines.push('}\n\n{"c":3}\r\n')).toEqual(['{"b":2}', '', '{"c":3}']);
    expect(lines.end()).toEqual([]);
  });

  it('gives the last line without a newline at the end', () => {
    const lines = new NdjsonLines();
    expect(lines.push('{"a":1}\r\n{"z":')).toEqual(['{"a":1}']);
    expect(lines.end()).toEqual(['{"z":']);
    expect(lines.end()).toEqual([]);
  });

  it('joins a long line sent in many small chunks', () => {
    const lines = new NdjsonLines();
    const long = 'x'.repeat(100_000);
    for (let i = 0; i < long.length; i += 7) expect(lines.push(long.slice(i, i + 7))).toEqual([]);
    expect(lines.push('\n')).toEqual([long]);
  });
});
