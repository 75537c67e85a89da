// A fake OpenAI-compatible model server for the benchmark, in a process of its
// own (so that the load generator's clients do not delay its writes): Chat
// Completions streamed as OpenAI sends them (SSE chunks, the finish reason, a
// usage chunk, `[DONE]`), at a fixed time to first token and token rate, in
// the shape of the test suite's FakeModelServer (libs/agents/src/testing).
//
// Each token's text is the time the server wrote it, `process.hrtime.bigint()`
// in microseconds, base 36, then a space: the machine's monotonic clock, which
// the client reads too, so that it can tell how long after the model's chunk
// each delta and the final message reached it. The first token goes out with
// the role chunk in one write; the last with the finish reason, the usage
// chunk and `[DONE]` in one write, then the response ends.
//
//   node bench/lib/fake-model.mjs --ttft-ms 100 --token-ms 20 --tokens 10
// prints `{"port": n}` once it listens.
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const stamp = () => `${(process.hrtime.bigint() / 1000n).toString(36)} `;

/** The write times (ns, the monotonic clock) in a text of this server's stamps. */
export const stampsOf = (text) =>
  text
    .split(' ')
    .filter((piece) => piece !== '')
    .map((piece) => parseInt(piece, 36) * 1000);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function chunk(delta, finishReason = null) {
  return {
    id: 'chatcmpl-bench',
    object: 'chat.completion.chunk',
    created: Math.floor(Date.now() / 1000),
    model: 'bench-model',
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
  };
}
const sse = (data) => `data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`;

function serve({ ttftMs, tokenMs, tokens }) {
  let streams = 0;
  const server = createServer(async (req, res) => {
    const parts = [];
    for await (const part of req) parts.push(part);
    let body = {};
    try {
      body = JSON.parse(Buffer.concat(parts).toString('utf8'));
    } catch {
      // answered like any other request
    }
    if (body.stream !== true) {
      // Not a step (a title request, should one come): a short non-streamed answer.
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id: 'chatcmpl-bench',
          object: 'chat.completion',
          created: Math.floor(Date.now() / 1000),
          model: 'bench-model',
          choices: [
            {
              index: 0,
              message: { role: 'assistant', content: 'Bench' },
              logprobs: null,
              finish_reason: 'stop',
            },
          ],
          usage: { prompt_tokens: 10, completion_tokens: 1, total_tokens: 11 },
        }),
      );
      return;
    }
    streams += 1;
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    res.flushHeaders();
    await sleep(ttftMs);
    const started = performance.now();
    for (let i = 0; i < tokens; i += 1) {
      if (res.destroyed) return;
      // On a fixed schedule from the first token: a late timer is not made up for by the next.
      const wait = started + i * tokenMs - performance.now();
      if (i > 0 && wait > 0) await sleep(wait);
      if (res.destroyed) return;
      const first = i === 0 ? sse(chunk({ role: 'assistant', content: '' })) : '';
      const content = sse(chunk({ content: stamp() }));
      if (i < tokens - 1) {
        res.write(first + content);
        continue;
      }
      res.end(
        first +
          content +
          sse(chunk({}, 'stop')) +
          sse({
            ...chunk({}),
            choices: [],
            usage: { prompt_tokens: 50, completion_tokens: tokens, total_tokens: 50 + tokens },
          }) +
          sse('[DONE]'),
      );
    }
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, '127.0.0.1', () => {
    process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`);
  });
  process.on('SIGTERM', () => {
    process.stderr.write(`fake model: ${streams} streams\n`);
    process.exit(0);
  });
}

/**
 * Starts the fake model in a child process; resolves with `{ url, settings, stop() }`
 * (`url` is the LLM_BASE_URL to give the services).
 */
export function startFakeModel(settings) {
  const child = spawn(
    process.execPath,
    [
      fileURLToPath(import.meta.url),
      '--ttft-ms',
      String(settings.ttftMs),
      '--token-ms',
      String(settings.tokenMs),
      '--tokens',
      String(settings.tokens),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  process.on('exit', () => child.kill('SIGKILL'));
  return new Promise((resolve, reject) => {
    let output = '';
    child.once('exit', (code) => reject(new Error(`the fake model exited (${code})`)));
    child.stdout.on('data', (data) => {
      output += data.toString();
      const line = output.split('\n')[0];
      if (!output.includes('\n')) return;
      const { port } = JSON.parse(line);
      child.removeAllListeners('exit');
      resolve({
        url: `http://127.0.0.1:${port}/v1`,
        pid: child.pid,
        settings,
        stop: () =>
          new Promise((done) => {
            if (child.exitCode !== null) return done();
            child.once('exit', () => done());
            child.kill('SIGTERM');
          }),
      });
    });
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      'ttft-ms': { type: 'string', default: '100' },
      'token-ms': { type: 'string', default: '20' },
      tokens: { type: 'string', default: '10' },
    },
  });
  serve({
    ttftMs: Number(values['ttft-ms']),
    tokenMs: Number(values['token-ms']),
    tokens: Math.max(1, Number(values.tokens)),
  });
}
