// Agent output is untrusted: Markdown is rendered with marked, then everything
// not plain HTML is removed by DOMPurify (scripts, event handlers, javascript:
// and other unsafe URLs, forms, styles). Links open in a new tab without the
// page's opener or referrer.
import DOMPurify from 'dompurify';
import { marked } from 'marked';

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});

const rendered = new WeakMap<object, string>();

export function renderMarkdown(text: string): string {
  const html = marked.parse(text, { async: false, gfm: true, breaks: true });
  return DOMPurify.sanitize(html, {
    USE_PROFILES: { html: true },
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'iframe'],
    FORBID_ATTR: ['style'],
  });
}

/** Rendered once per event object: a stored message never changes. */
export function renderMarkdownOnce(key: object, text: string): string {
  let html = rendered.get(key);
  if (html === undefined) {
    html = renderMarkdown(text);
    rendered.set(key, html);
  }
  return html;
}
