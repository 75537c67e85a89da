/** The tools every agent may call (docs/protocol.md "Tools"): `current_time` and `set_state`. */
import type { ToolDefinition } from '../agent.js';
import { StatefulResult } from './tool-registry.js';

export const BUILTIN_TOOLS: Record<string, ToolDefinition> = {
  current_time: {
    description: 'The current time in ISO 8601, UTC.',
    parameters: { type: 'object', properties: {}, additionalProperties: false },
    idempotent: true,
    run: () => new Date().toISOString(),
  },
  set_state: {
    description:
      'Stores a value in the session state: a plain key for this conversation, a `user:` key for every conversation of the user.',
    parameters: {
      type: 'object',
      properties: { key: { type: 'string', minLength: 1, maxLength: 256 }, value: {} },
      required: ['key', 'value'],
      additionalProperties: false,
    },
    idempotent: true,
    run: (args) => {
      const key = args['key'] as string;
      if (key.includes(':') && !key.startsWith('user:')) {
        throw new Error('set_state takes a plain key or a user: key');
      }
      const name = key.replace(/^user:/, '');
      if (name === '') throw new Error('set_state takes a key name after user:');
      // Assigned to a state object, it would set its prototype, not a value: nothing stored.
      if (name === '__proto__') throw new Error('set_state cannot store the key __proto__');
      return new StatefulResult({ stored: key }, { [key]: args['value'] ?? null });
    },
  },
};
