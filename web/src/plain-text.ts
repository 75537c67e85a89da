// A message shown as written: its text, line breaks kept, never parsed. A
// message may hold 262,144 characters (or 131,072 lines), and laying out that
// much text at once blocks the page for seconds, so long text is shown in
// pieces of a few dozen lines with `content-visibility: auto`: the browser lays
// out only the pieces on screen, and sizes the others from an estimate until
// they are scrolled to (then from what they measured).
import { Component, h } from 'preact';

/** The most characters a piece holds. */
export const PIECE_CHARS = 8_000;
/** The most lines a piece holds. */
export const PIECE_LINES = 200;
/** Characters on one row of a message, to estimate how many rows a line wraps into. */
const CHARS_PER_ROW = 80;

export interface PlainTextPiece {
  text: string;
  /** Estimated rows on screen: each line, wrapped every CHARS_PER_ROW characters. */
  rows: number;
}

const NEWLINE = 0x0a;

/**
 * The text cut into pieces of at most PIECE_LINES lines and PIECE_CHARS
 * characters, each ending after a line break where it can (a longer line is
 * cut, never inside a surrogate pair). Joined, they are the text. Linear.
 */
export function plainTextPieces(text: string): PlainTextPiece[] {
  const pieces: PlainTextPiece[] = [];
  let start = 0;
  while (start < text.length) {
    const limit = Math.min(text.length, start + PIECE_CHARS);
    let end = limit;
    let lines = 0;
    let lineStart = start;
    let rows = 0;
    for (let i = start; i < limit; i += 1) {
      if (text.charCodeAt(i) !== NEWLINE) continue;
      rows += rowsOf(i - lineStart);
      lineStart = i + 1;
      lines += 1;
      end = i + 1;
      if (lines === PIECE_LINES) break;
    }
    if (lines < PIECE_LINES && limit === text.length) end = text.length;
    else if (lines === 0 && isHighSurrogate(text.charCodeAt(end - 1))) end -= 1;
    if (lineStart < end) rows += rowsOf(end - lineStart);
    pieces.push({ text: text.slice(start, end), rows });
    start = end;
  }
  return pieces;
}

function rowsOf(characters: number): number {
  return Math.max(1, Math.ceil(characters / CHARS_PER_ROW));
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}

/**
 * The text as paragraphs of class `plain-text` (`white-space: pre-wrap`); a
 * long one's pieces also `plain-text-piece` (`content-visibility: auto`),
 * each sized from its estimated rows while off screen (set through the CSS
 * object model, which the page's Content-Security-Policy allows). Drawn again
 * only when the text changes: a message is drawn on every streamed delta.
 */
export class PlainText extends Component<{ text: string }> {
  override shouldComponentUpdate(next: { text: string }): boolean {
    return next.text !== this.props.text;
  }

  override render() {
    const { text } = this.props;
    const pieces = plainTextPieces(text);
    if (pieces.length === 1) return h('p', { class: 'plain-text' }, text);
    return pieces.map((piece, index) =>
      h(
        'p',
        {
          key: index,
          class: 'plain-text plain-text-piece',
          style: { containIntrinsicBlockSize: `auto ${piece.rows}lh` },
        },
        piece.text,
      ),
    );
  }
}
