import { describe, expect, it, vi } from 'vitest';
import { SessionState } from './session-state.js';

function loaded(): SessionState {
  const state = new SessionState();
  state.load({ plain: 1, 'temp:t': 2, 'user:color': 'red', 'user:gone': true, 'app:motd': 'hi' });
  return state;
}

describe(SessionState.name, () => {
  it('reads nothing until another conversation changed shared keys', async () => {
    const state = loaded();
    const read = vi.fn(() => Promise.resolve({}));
    await state.refresh(read);
    expect(read).not.toHaveBeenCalled();
    expect(state.isStale).toBe(false);
  });

  it('then replaces the app: and user: keys by those read, and keeps plain and temp: keys', async () => {
    const state = loaded();
    state.markStale();
    expect(state.isStale).toBe(true);
    await state.refresh(() => Promise.resolve({ 'user:color': 'teal', 'app:motd': 'hello' }));
    expect(state.current).toEqual({
      plain: 1,
      'temp:t': 2,
      'user:color': 'teal',
      'app:motd': 'hello',
    });
    expect(state.isStale).toBe(false);
    const read = vi.fn(() => Promise.resolve({}));
    await state.refresh(read);
    expect(read).not.toHaveBeenCalled();
  });

  it('stays stale when a change is heard of while it reads: the read may have missed it', async () => {
    const state = loaded();
    state.markStale();
    await state.refresh(() => {
      state.markStale();
      return Promise.resolve({ 'user:color': 'teal' });
    });
    expect(state.current['user:color']).toBe('teal');
    expect(state.isStale).toBe(true);
    await state.refresh(() => Promise.resolve({ 'user:color': 'blue' }));
    expect(state.current['user:color']).toBe('blue');
    expect(state.isStale).toBe(false);
  });

  it('keeps every key and stays stale when the read fails', async () => {
    const state = loaded();
    const before = state.current;
    state.markStale();
    await expect(state.refresh(() => Promise.reject(new Error('db down')))).rejects.toThrow(
      'db down',
    );
    expect(state.current).toEqual(before);
    expect(state.isStale).toBe(true);
  });

  it("applies the session's own deltas, null deleting", () => {
    const state = loaded();
    state.apply({ plain: null, 'user:color': 'green' });
    expect(state.current).toEqual({
      'temp:t': 2,
      'user:color': 'green',
      'user:gone': true,
      'app:motd': 'hi',
    });
  });
});
