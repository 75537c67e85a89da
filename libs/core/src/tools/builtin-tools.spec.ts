import { describe, expect, it } from 'vitest';
import { BUILTIN_TOOLS } from './builtin-tools.js';
import type { StatefulResult } from './tool-registry.js';

const context = {
  signal: new AbortController().signal,
  idempotency_key: 'call-1',
  conversation_id: 'c',
};

describe('set_state', () => {
  const setState = BUILTIN_TOOLS['set_state']!;

  it('stores a plain key or a user: key as an own property of the state change', () => {
    for (const key of ['colour', 'user:colour']) {
      const result = setState.run({ key, value: 'blue' }, context) as StatefulResult;
      expect(result.value).toEqual({ stored: key });
      expect(Object.hasOwn(result.stateDelta, key)).toBe(true);
    }
  });

  it('refuses a key of another scope and __proto__ (it would set a prototype and store nothing)', () => {
    expect(() => setState.run({ key: 'app:colour', value: 1 }, context)).toThrow(/plain key/);
    expect(() => setState.run({ key: 'user:', value: 1 }, context)).toThrow(/a key name/);
    for (const key of ['__proto__', 'user:__proto__']) {
      expect(() => setState.run({ key, value: { polluted: 1 } }, context)).toThrow(/__proto__/);
    }
  });
});
