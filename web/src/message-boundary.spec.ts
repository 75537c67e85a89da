// @vitest-environment jsdom
import { h, render, type VNode } from 'preact';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { MessageBoundary } from './message-boundary.js';

function Throws(): never {
  throw new RangeError('Maximum call stack size exceeded');
}

describe(MessageBoundary.name, () => {
  afterEach(() => vi.restoreAllMocks());

  it('shows its fallback for the entry that threw, and the entries around it', async () => {
    const logged = vi.spyOn(console, 'error').mockImplementation(() => undefined);
    const container = document.createElement('div');
    const entry = (text: string, child: () => VNode) =>
      h(
        MessageBoundary,
        { key: text, fallback: () => h('p', null, `${text} as text`) },
        h(child, null),
      );
    render(
      h('div', null, [
        entry('before', () => h('p', null, 'before')),
        entry('hostile', Throws),
        entry('after', () => h('p', null, 'after')),
      ]),
      container,
    );
    await new Promise((resolve) => setTimeout(resolve, 0));
    expect([...container.querySelectorAll('p')].map((p) => p.textContent)).toEqual([
      'before',
      'hostile as text',
      'after',
    ]);
    expect(logged).toHaveBeenCalledOnce();
  });
});
