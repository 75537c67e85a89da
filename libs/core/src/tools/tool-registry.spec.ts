import { describe, expect, it } from 'vitest';
import { ToolRegistry } from './tool-registry.js';

const context = {
  signal: new AbortController().signal,
  idempotency_key: 'c:1',
  conversation_id: 'c',
};

describe('ToolRegistry.run', () => {
  it('answers a tool that throws without a message with an is_error result that says which failed', async () => {
    const tools = new ToolRegistry(1000);
    for (const [name, thrown] of [
      ['silent', new Error()],
      ['blank', '  '],
    ] as const) {
      tools.add(name, {
        description: 'fails',
        parameters: { type: 'object' },
        idempotent: true,
        run: () => {
          // eslint-disable-next-line @typescript-eslint/only-throw-error -- a module's tool may throw anything
          throw thrown;
        },
      });
      const outcome = await tools.run(name, {}, context);
      expect(outcome).toMatchObject({
        content: `${name} failed without saying why`,
        isError: true,
        outcome: 'error',
      });
    }
  });
});
