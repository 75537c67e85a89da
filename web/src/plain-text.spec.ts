// @vitest-environment jsdom
import { h, render } from 'preact';
import { describe, expect, it } from 'vitest';
import { PIECE_CHARS, PIECE_LINES, PlainText, plainTextPieces } from './plain-text.js';

describe(plainTextPieces.name, () => {
  it('keeps a short text whole, with its estimated rows', () => {
    expect(plainTextPieces('one line')).toEqual([{ text: 'one line', rows: 1 }]);
    expect(plainTextPieces('a\nb\n')).toEqual([{ text: 'a\nb\n', rows: 2 }]);
    expect(plainTextPieces('x'.repeat(200))).toEqual([{ text: 'x'.repeat(200), rows: 3 }]);
    expect(plainTextPieces('')).toEqual([]);
  });

  it('cuts many lines after every PIECE_LINES line breaks', () => {
    const text = 'a line\n'.repeat(PIECE_LINES * 2 + 3);
    const pieces = plainTextPieces(text);
    expect(pieces.map((piece) => piece.text.split('\n').length - 1)).toEqual([
      PIECE_LINES,
      PIECE_LINES,
      3,
    ]);
    expect(pieces.map((piece) => piece.rows)).toEqual([PIECE_LINES, PIECE_LINES, 3]);
    expect(pieces.map((piece) => piece.text).join('')).toBe(text);
  });

  it('cuts long lines after a line break where it can, else at PIECE_CHARS', () => {
    const line = 'w'.repeat(PIECE_CHARS / 2 + 10);
    const text = `${line}\n${line}\n${'z'.repeat(PIECE_CHARS * 2 + 5)}`;
    const pieces = plainTextPieces(text);
    expect(pieces.map((piece) => piece.text.length)).toEqual([
      line.length + 1,
      line.length + 1,
      PIECE_CHARS,
      PIECE_CHARS,
      5,
    ]);
    expect(pieces.map((piece) => piece.text).join('')).toBe(text);
  });

  it('never cuts a surrogate pair, and joins back to the text of a full-size message', () => {
    const emoji = `a${'😀'.repeat(PIECE_CHARS)}`;
    const pieces = plainTextPieces(emoji);
    // No piece ends with the first half of a pair, or starts with the second.
    for (const piece of pieces) expect(piece.text).not.toMatch(/[\uD800-\uDBFF]$|^[\uDC00-\uDFFF]/);
    expect(pieces.map((piece) => piece.text).join('')).toBe(emoji);

    const hostile = '*a\n> - _b_ `c` [d]\n'.repeat(262_144 / 19);
    expect(
      plainTextPieces(hostile)
        .map((piece) => piece.text)
        .join(''),
    ).toBe(hostile);
  });
});

describe(PlainText.name, () => {
  function draw(text: string): HTMLElement {
    const container = document.createElement('div');
    render(h(PlainText, { text }), container);
    return container;
  }

  it('shows a short text as one paragraph, markup in it as text', () => {
    const container = draw('<b>not bold</b>\n**not strong**');
    expect(container.innerHTML).toBe(
      '<p class="plain-text">&lt;b&gt;not bold&lt;/b&gt;\n**not strong**</p>',
    );
  });

  it('shows a long text as pieces laid out only on screen, holding every character', () => {
    const text = '> - *a\n'.repeat(PIECE_LINES * 5);
    const container = draw(text);
    const pieces = container.querySelectorAll('p.plain-text.plain-text-piece');
    expect(pieces).toHaveLength(5);
    expect(container.textContent).toBe(text);
  });
});
