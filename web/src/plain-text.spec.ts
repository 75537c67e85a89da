// @vitest-environment jsdom
import { h, render } from 'preact';
import { describe, expect, it } from 'vitest';
import { MARKDOWN_MAX_CHARS } from './markdown.js';
import {
  CHARS_PER_ROW,
  COLLAPSE_CHARS,
  collapsedHead,
  HEAD_ROWS,
  MessageText,
  type MessageTextProps,
  PIECE_CHARS,
  PIECE_LINES,
  PlainText,
  plainTextPieces,
} from './plain-text.js';

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

describe(collapsedHead.name, () => {
  it('shows a text of up to COLLAPSE_CHARS characters whole, as long as Markdown is rendered', () => {
    expect(COLLAPSE_CHARS).toBe(MARKDOWN_MAX_CHARS);
    expect(collapsedHead('')).toBeUndefined();
    expect(collapsedHead('a short message')).toBeUndefined();
    expect(collapsedHead('a\n'.repeat(COLLAPSE_CHARS / 2))).toBeUndefined();
    expect(collapsedHead('x'.repeat(COLLAPSE_CHARS))).toBeUndefined();
  });

  it('collapses a longer text to its first HEAD_ROWS lines', () => {
    expect(collapsedHead(`${'a line\n'.repeat(COLLAPSE_CHARS / 7)}and more`)).toBe(
      'a line\n'.repeat(HEAD_ROWS),
    );
    // The longest message of short lines, or of empty ones: its first lines, whatever they hold.
    expect(collapsedHead('a\n'.repeat(131_072))).toBe('a\n'.repeat(HEAD_ROWS));
    expect(collapsedHead('> a\n'.repeat(65_536))).toBe('> a\n'.repeat(HEAD_ROWS));
    expect(collapsedHead('\n'.repeat(COLLAPSE_CHARS + 1))).toBe('\n'.repeat(HEAD_ROWS));
  });

  it('cuts a long line after the rows left (CHARS_PER_ROW characters a row), never inside a surrogate pair', () => {
    expect(collapsedHead('*a'.repeat(131_072))).toBe('*a'.repeat((HEAD_ROWS * CHARS_PER_ROW) / 2));
    // Lines before it fill some of the rows, the long line the rest.
    const lines = 'a line\n'.repeat(HEAD_ROWS - 2);
    const text = `${lines}${'y'.repeat(COLLAPSE_CHARS)}`;
    expect(collapsedHead(text)).toBe(`${lines}${'y'.repeat(2 * CHARS_PER_ROW)}`);
    // A line of 100 characters is two rows: with one row left, its first 80.
    const last = `${'a line\n'.repeat(HEAD_ROWS - 1)}${'z'.repeat(100)}\n`;
    expect(collapsedHead(last.repeat(50))).toBe(last.slice(0, -21));
    const emoji = `a${'😀'.repeat(COLLAPSE_CHARS)}`;
    const head = collapsedHead(emoji);
    expect(head).toBe(`a${'😀'.repeat((HEAD_ROWS * CHARS_PER_ROW) / 2 - 1)}`);
    expect(head).not.toMatch(/[\uD800-\uDBFF]$/);
  });

  it('keeps the same start while a collapsed text grows, as a streamed one does', () => {
    let text = '';
    const heads = new Set<string>();
    for (let line = 0; text.length < COLLAPSE_CHARS * 2; line += 1) {
      text += `line ${line} ${'w'.repeat(line % 150)}\n`;
      const head = collapsedHead(text);
      if (head !== undefined) heads.add(head);
      else expect(heads.size).toBe(0); // once collapsed, it stays collapsed
    }
    expect(heads.size).toBe(1);
    expect(text.startsWith([...heads][0]!)).toBe(true);
  });
});

describe(MessageText.name, () => {
  function draw(props: Partial<MessageTextProps> & { text: string }, container?: HTMLElement) {
    const into = container ?? document.createElement('div');
    const toggled: string[] = [];
    render(
      h(MessageText, {
        id: 'text-1',
        class: 'message-body message-text',
        expanded: false,
        onToggle: () => toggled.push('toggled'),
        ...props,
      }),
      into,
    );
    const body = into.querySelector<HTMLElement>('#text-1')!;
    return { container: into, body, button: into.querySelector('button'), toggled };
  }

  it('shows a short text whole, without a button', () => {
    const { body, button } = draw({ text: 'a\n'.repeat(COLLAPSE_CHARS / 2) });
    expect(body.textContent).toBe('a\n'.repeat(COLLAPSE_CHARS / 2));
    expect(body.getAttribute('dir')).toBe('auto');
    expect(button).toBeNull();
  });

  it('shows a long text collapsed to its start, with a button that shows it whole', () => {
    const text = 'a\n'.repeat(131_072);
    const { container, body, button, toggled } = draw({ text });
    expect(body.textContent).toBe('a\n'.repeat(HEAD_ROWS));
    expect(body.classList.contains('collapsed')).toBe(true);
    expect(body.querySelectorAll('p')).toHaveLength(1);
    expect(button?.textContent).toBe('Show the whole message (262,144 characters)');
    expect(button?.getAttribute('type')).toBe('button');
    expect(button?.getAttribute('aria-expanded')).toBe('false');
    expect(button?.getAttribute('aria-controls')).toBe('text-1');
    button?.click();
    expect(toggled).toEqual(['toggled']);

    // Shown whole: every character, in pieces; the same button collapses it again.
    const expanded = draw({ text, expanded: true }, container);
    expect(expanded.body.textContent).toBe(text);
    expect(expanded.body.classList.contains('collapsed')).toBe(false);
    expect(expanded.body.querySelectorAll('p.plain-text-piece').length).toBeGreaterThan(1);
    expect(expanded.button).toBe(button);
    expect(button?.textContent).toBe('Show less');
    expect(button?.getAttribute('aria-expanded')).toBe('true');
  });
});
