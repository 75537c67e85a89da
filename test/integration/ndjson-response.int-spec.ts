// An NDJSON answer (ndjsonResponse) on a real HTTP server, to a client that
// reads nothing until told: a write of more than the sockets' buffers hold
// waits for the client, and holds none of its values while it waits (their
// text is in the socket's buffer). V8's collector is run by the test.
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { connect } from 'node:net';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ndjsonResponse } from '../../libs/gateway/src/lifecycle/ndjson-response.js';

setFlagsFromString('--expose-gc');
const collectGarbage = runInNewContext('gc') as () => void;

const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

// Far more than a loopback socket's send and receive buffers hold together.
const VALUES = 40_000;
const line = 'x'.repeat(1000);

describe(ndjsonResponse.name, () => {
  let server: ReturnType<ReturnType<typeof express>['listen']>;
  let written: { values: WeakRef<readonly unknown[]>; done: Promise<'taken' | Error> } | null =
    null;
  let onWrite: () => void = () => undefined;

  beforeAll(async () => {
    const app = express();
    app.get('/export', (_request, response) => {
      const sink = ndjsonResponse(response);
      const values = Array.from({ length: VALUES }, (_, n) => ({ n, line }));
      written = {
        values: new WeakRef(values),
        done: sink.write(values).then(
          () => 'taken' as const,
          (error: Error) => error,
        ),
      };
      onWrite();
      void written.done.then(() => response.end());
    });
    server = app.listen(0, '127.0.0.1');
    await once(server, 'listening');
  });

  afterAll(async () => {
    server?.close();
    await once(server, 'close');
  });

  it('waits for a client that is behind without holding the values it wrote', async () => {
    const socket = connect((server.address() as AddressInfo).port, '127.0.0.1');
    socket.pause();
    await once(socket, 'connect');
    try {
      await readSlowly(socket);
    } finally {
      socket.destroy();
    }
  });

  async function readSlowly(socket: ReturnType<typeof connect>): Promise<void> {
    const wrote = new Promise<void>((resolve) => (onWrite = resolve));
    socket.write('GET /export HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n');
    await wrote;
    await nextTurn();
    collectGarbage();
    const state = await Promise.race([written!.done, nextTurn().then(() => 'waiting')]);
    expect(state).toBe('waiting');
    expect(written!.values.deref()).toBeUndefined();

    // The client reads: the write resolves, every line arrives.
    let newlines = 0;
    socket.on('data', (chunk: Buffer) => {
      for (const byte of chunk) if (byte === 10) newlines += 1;
    });
    socket.resume();
    expect(await written!.done).toBe('taken');
    await once(socket, 'end');
    expect(newlines).toBeGreaterThanOrEqual(VALUES);
  }
});
