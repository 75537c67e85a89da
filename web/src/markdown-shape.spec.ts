// @vitest-environment jsdom
// (markdown.js, read for MARKDOWN_MAX_DEPTH, sets DOMPurify up on load: it needs a DOM.)
import { describe, expect, it } from 'vitest';
import { MARKDOWN_MAX_DEPTH } from './markdown.js';
import { markdownDepth, markdownShape } from './markdown-shape.js';

describe(markdownDepth.name, () => {
  it('counts block quote and list markers, and two columns of indentation, per line', () => {
    expect(markdownDepth('plain text')).toBe(0);
    expect(markdownDepth('> > > a')).toBe(3);
    expect(markdownDepth('>>>>a')).toBe(4);
    expect(markdownDepth('>>>>>>')).toBe(6);
    expect(markdownDepth('- 1. * + > a')).toBe(5);
    expect(markdownDepth('- a\n  - b\n    - c')).toBe(3);
    expect(markdownDepth('\t\t- a')).toBe(5);
    expect(markdownDepth('-a and 1.5 and 2020. and *a')).toBe(1);
  });

  it('counts emphasis, strikethrough and brackets open at once in a paragraph', () => {
    expect(markdownDepth('*a* _b_ ~~c~~ [d](e) *a*a*a*a*a')).toBe(2);
    expect(markdownDepth('***a*** and **b**')).toBe(3);
    expect(markdownDepth('*a *b *c d* e* f*')).toBe(3);
    expect(markdownDepth('[[[x]]]')).toBe(3);
    expect(markdownDepth('snake_case_name and 2 * 3 and \\*\\*\\*')).toBe(0);
    // A paragraph ends at a blank line; what it left open is closed.
    expect(markdownDepth('*a *b\n\n*c *d')).toBe(2);
    expect(markdownDepth('*a *b\n*c *d')).toBe(4);
  });

  it('counts the lines holding text, outside fenced code', () => {
    expect(markdownShape('a\n\nb\n> \n> c\n- d\n```\ne\nf\n```\ng').lines).toBe(5);
    expect(markdownShape('').lines).toBe(0);
  });

  it('skips fenced code at the top level, up to its closing fence', () => {
    const code = '```js\n' + '> '.repeat(100) + '\n```\n';
    expect(markdownDepth(code)).toBe(0);
    expect(markdownDepth(code + '> > a')).toBe(2);
    expect(markdownDepth('~~~~\n' + ' '.repeat(100) + 'x\n~~~\n' + ' '.repeat(100) + 'x')).toBe(0);
    expect(markdownDepth('``` a`b\n> > > a')).toBe(3); // not a fence: its info has a backtick
    expect(MARKDOWN_MAX_DEPTH).toBeLessThan(100);
  });
});
