// The webhook endpoint of the benchmark: a real HTTP server on this host
// that answers 204 at once and records, for each `turn.completed`, how long
// after the answer was stored it arrived (the body's timestamp is the
// event's stored time; both clocks are this machine's). One request in ten
// is verified with the Standard Webhooks library, to keep the load
// generator's own CPU down while still checking the signatures.
import { createServer } from 'node:http';
import { Webhook } from 'standardwebhooks';

export async function startWebhookReceiver() {
  const secret = `whsec_${Buffer.from('bench-webhooks-key-24byt').toString('base64')}`;
  const verifier = new Webhook(secret);
  const receiver = {
    url: '',
    secret,
    /** [arrival time (ms since the epoch), lag (ms)] of each turn.completed. */
    turns: [],
    requests: 0,
    badSignatures: 0,
    seen: new Set(),
    repeats: 0,
  };
  const server = createServer((request, response) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', () => {
      const arrived = Date.now();
      receiver.requests += 1;
      const raw = Buffer.concat(chunks).toString('utf8');
      const id = String(request.headers['webhook-id']);
      if (receiver.requests % 10 === 0) {
        try {
          verifier.verify(raw, {
            'webhook-id': id,
            'webhook-timestamp': String(request.headers['webhook-timestamp']),
            'webhook-signature': String(request.headers['webhook-signature']),
          });
        } catch {
          receiver.badSignatures += 1;
        }
      }
      response.writeHead(204).end();
      if (receiver.seen.has(id)) {
        receiver.repeats += 1;
        return;
      }
      receiver.seen.add(id);
      const body = JSON.parse(raw);
      if (body.type === 'turn.completed') {
        receiver.turns.push([arrived, arrived - Date.parse(body.timestamp)]);
      }
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  receiver.url = `http://127.0.0.1:${server.address().port}/bench-hooks`;
  receiver.stop = () =>
    new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return receiver;
}
