import { describe, expect, it } from 'vitest';
import { outdatesScopes, scopedStateChangeOf, type ScopedStateChange } from './state.js';

const conversation = { id: 'conv-a', tenantId: 't', appName: 'app', userId: 'ada' };

describe(scopedStateChangeOf.name, () => {
  it('names the scopes whose keys the drafts store or delete, from the conversation that stores them', () => {
    expect(
      scopedStateChangeOf(conversation, [
        { stateDelta: { plain: 1 } },
        {},
        { stateDelta: { 'user:color': null } },
      ]),
    ).toEqual({
      tenantId: 't',
      appName: 'app',
      userId: 'ada',
      app: false,
      user: true,
      origin: 'conv-a',
    });
    expect(scopedStateChangeOf(conversation, [{ stateDelta: { 'app:motd': 'hi' } }])).toMatchObject(
      { app: true, user: false },
    );
  });

  it('is null for drafts with plain or temp: keys only', () => {
    expect(
      scopedStateChangeOf(conversation, [{ stateDelta: { plain: 1, 'temp:x': 2 } }, {}]),
    ).toBeNull();
  });
});

describe(outdatesScopes.name, () => {
  const change = (overrides: Partial<ScopedStateChange>): ScopedStateChange => ({
    tenantId: 't',
    appName: 'app',
    userId: 'ada',
    app: false,
    user: true,
    origin: 'conv-b',
    ...overrides,
  });

  it("outdates the user's other conversations of the app for user: keys, every conversation of the app for app: keys", () => {
    expect(outdatesScopes(change({}), conversation)).toBe(true);
    expect(outdatesScopes(change({ userId: 'bob', app: true, user: true }), conversation)).toBe(
      true,
    );
  });

  it('leaves alone the conversation that stored them, other users, apps and tenants', () => {
    expect(outdatesScopes(change({ origin: 'conv-a' }), conversation)).toBe(false);
    expect(outdatesScopes(change({ userId: 'bob' }), conversation)).toBe(false);
    expect(outdatesScopes(change({ appName: 'other', app: true }), conversation)).toBe(false);
    expect(outdatesScopes(change({ tenantId: 'other', app: true }), conversation)).toBe(false);
  });

  it('takes any app for its own while the conversation is not read yet', () => {
    expect(outdatesScopes(change({ appName: 'other' }), { ...conversation, appName: null })).toBe(
      true,
    );
  });
});
