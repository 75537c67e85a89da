// A message shown as written: its text, line breaks kept, never parsed. A
// message may hold 262,144 characters (or 131,072 lines), and laying out that
// much text at once blocks the page for seconds, so long text is shown in
// pieces of a few dozen lines with `content-visibility: auto`: the browser lays
// out only the pieces on screen, and sizes the others from an estimate until
// they are scrolled to (then from what they measured).
//
// Even so, a page of hundreds of pieces costs tens of milliseconds to build,
// style and lay out (and the browser checks each piece against the screen on
// every frame after), for a message no one reads whole at a glance. So a text
// of more than COLLAPSE_CHARS characters is shown collapsed, as chat apps do: its
// first HEAD_ROWS rows, then a button that shows the whole of it in place
// (and collapses it again). Its cost on arrival no longer grows with its
// length; the reader who asks for the whole text waits for it then.
import { Component, createRef, h } from 'preact';
import { MARKDOWN_MAX_CHARS } from './markdown.js';

/** The most characters a piece holds. */
export const PIECE_CHARS = 8_000;
/** The most lines a piece holds. */
export const PIECE_LINES = 200;
/** Characters on one row of a message, to estimate how many rows a line wraps into. */
export const CHARS_PER_ROW = 80;

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

/**
 * A longer text is shown collapsed. As long as the longest message rendered as
 * Markdown (whose HTML is shown whole), so that a message is collapsed whether
 * it is shown as plain text or not, and a streamed answer is not collapsed
 * only to be shown whole once stored.
 */
export const COLLAPSE_CHARS = MARKDOWN_MAX_CHARS;
/** The rows a collapsed text shows. */
export const HEAD_ROWS = 40;

/**
 * The start of a text too long to show at once (more than COLLAPSE_CHARS
 * characters), or undefined when it is shown whole: its first HEAD_ROWS rows
 * (each line wrapped every CHARS_PER_ROW characters, as plainTextPieces
 * estimates), whole lines where they fit, else the line that does not is cut
 * there (never inside a surrogate pair). Reads only those rows. As a text
 * grows (streamed), once it is collapsed its start stays the same.
 */
export function collapsedHead(text: string): string | undefined {
  if (text.length <= COLLAPSE_CHARS) return undefined;
  let rows = 0;
  let start = 0;
  for (;;) {
    const newline = text.indexOf('\n', start);
    const lineEnd = newline === -1 ? text.length : newline;
    const lineRows = rowsOf(lineEnd - start);
    if (rows + lineRows > HEAD_ROWS || newline === -1) {
      // The line that does not fit is cut after the rows left.
      let end = Math.min(lineEnd, start + (HEAD_ROWS - rows) * CHARS_PER_ROW);
      if (isHighSurrogate(text.charCodeAt(end - 1))) end -= 1;
      return text.slice(0, end);
    }
    rows += lineRows;
    if (rows === HEAD_ROWS) return text.slice(0, newline + 1);
    start = newline + 1;
  }
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

const COUNT = new Intl.NumberFormat('en');

export interface MessageTextProps {
  text: string;
  /** The id of the element holding the text: the button controls it. */
  id: string;
  /** The classes of that element. */
  class: string;
  /** A collapsed text shown whole: the reader asked for it. */
  expanded: boolean;
  /** The button was pressed: show the text whole if it was collapsed, else collapse it. */
  onToggle: () => void;
  /** On an agent's message shown as plain text, why (its `data-plain-text`). */
  plain?: string;
}

/**
 * A message's text (PlainText in an element of its own, `dir="auto"`): a long
 * one collapsed (see collapsedHead) unless `expanded`, with a button, "Show
 * the whole message (N characters)" while collapsed and "Show less" once
 * shown whole (`aria-expanded`, `aria-controls` the text). The button stays
 * the same element, so the keyboard focus stays on it; collapsing again
 * scrolls it into view, since the text above it shrinks. Drawn again only
 * when what it shows changes: messages are drawn on every streamed delta.
 */
export class MessageText extends Component<MessageTextProps> {
  private readonly button = createRef<HTMLButtonElement>();

  override shouldComponentUpdate(next: MessageTextProps): boolean {
    const now = this.props;
    return (
      next.text !== now.text ||
      next.expanded !== now.expanded ||
      next.id !== now.id ||
      next.class !== now.class ||
      next.plain !== now.plain
    );
  }

  override componentDidUpdate(previous: MessageTextProps): void {
    if (previous.expanded && !this.props.expanded) {
      this.button.current?.scrollIntoView({ block: 'nearest' });
    }
  }

  override render() {
    const { text, id, expanded, plain } = this.props;
    const head = collapsedHead(text);
    const body = (shown: string, collapsed: boolean) =>
      h(
        'div',
        {
          id,
          class: collapsed ? `${this.props.class} collapsed` : this.props.class,
          dir: 'auto',
          'data-plain-text': plain,
        },
        h(PlainText, { text: shown }),
      );
    if (head === undefined) return body(text, false);
    return [
      body(expanded ? text : head, !expanded),
      h(
        'button',
        {
          type: 'button',
          class: 'small text-toggle',
          'aria-expanded': expanded,
          'aria-controls': id,
          ref: this.button,
          // (props read now: this component is not drawn again when only the callback changes)
          onClick: () => this.props.onToggle(),
        },
        expanded ? 'Show less' : `Show the whole message (${COUNT.format(text.length)} characters)`,
      ),
    ];
  }
}
