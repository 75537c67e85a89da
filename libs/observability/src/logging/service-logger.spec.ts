import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { conversationLogFields, createServiceLogger, logCallback } from './service-logger.js';

function capture(): { lines: () => Record<string, unknown>[]; stream: Writable } {
  let text = '';
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      text += chunk.toString();
      done();
    },
  });
  return {
    stream,
    lines: () =>
      text
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}

describe('createServiceLogger', () => {
  it('writes one JSON object per line with level, time, msg and the role', () => {
    const out = capture();
    const logger = createServiceLogger({
      level: 'info',
      format: 'json',
      role: 'worker',
      bindings: { worker_id: 'w-1' },
      destination: out.stream,
    });
    logger.info('ready');
    const [line] = out.lines();
    expect(line).toMatchObject({ level: 'info', msg: 'ready', role: 'worker', worker_id: 'w-1' });
    expect(new Date(String(line!.time)).toISOString()).toBe(line!.time);
  });

  it('honours the level', () => {
    const out = capture();
    const logger = createServiceLogger({
      level: 'warn',
      format: 'json',
      role: 'gateway',
      destination: out.stream,
    });
    logger.info('not shown');
    logger.debug('not shown either');
    logger.warn('shown');
    expect(out.lines().map((line) => line.msg)).toEqual(['shown']);
  });

  it('redacts credentials wherever a line carries them', () => {
    const out = capture();
    const logger = createServiceLogger({
      level: 'debug',
      format: 'json',
      role: 'gateway',
      destination: out.stream,
    });
    logger.info(
      {
        token: 'tok-1',
        req: { headers: { authorization: 'Bearer tok-2', cookie: 'c=tok-3', 'x-api-key': 'k-1' } },
        llm: { apiKey: 'k-2' },
        config: { auth: { jwtSecret: 'k-3' } },
      },
      'request',
    );
    const text = JSON.stringify(out.lines());
    for (const secret of ['tok-1', 'tok-2', 'tok-3', 'k-1', 'k-2', 'k-3'])
      expect(text).not.toContain(secret);
    expect(text).toContain('[redacted]');
  });
});

describe('logCallback', () => {
  it("writes the host's (level, message, fields) lines with their context and ids", () => {
    const out = capture();
    const logger = createServiceLogger({
      level: 'info',
      format: 'json',
      role: 'worker',
      destination: out.stream,
    });
    const log = logCallback(logger, 'ConversationHost');
    const ref = { tenantId: 't', userId: 'u', conversationId: 'c' };
    log('warn', 'slot lost', { ...conversationLogFields(ref, 7) });
    log('log', 'plain');
    expect(out.lines()).toMatchObject([
      {
        level: 'warn',
        context: 'ConversationHost',
        msg: 'slot lost',
        conversation_id: 'c',
        tenant_id: 't',
        user_id: 'u',
        lease_epoch: 7,
      },
      { level: 'info', context: 'ConversationHost', msg: 'plain' },
    ]);
  });
});
