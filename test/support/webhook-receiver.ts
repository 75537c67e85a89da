// A product backend's webhook endpoint for tests: a real HTTP server that
// verifies every request with the Standard Webhooks library (`standardwebhooks`)
// and records what it received, answering as the test says (2xx, 500, a
// redirect, never) or refusing connections while it is down.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';
import type { WebhookBody } from '@cs/protocol';

export interface ReceivedWebhook {
  id: string;
  body: WebhookBody;
  /** Byte length of the raw body. */
  bytes: number;
  /** When it arrived (ms since the epoch). */
  at: number;
}

/** How the receiver answers one verified request: a status, or `hang` (never). */
export type WebhookAnswer = number | 'hang';

export interface WebhookReceiver {
  url: string;
  secret: string;
  /** Every verified request, in arrival order, repeats included. */
  received: ReceivedWebhook[];
  /** Requests whose signature did not verify. */
  rejected: number;
  /** Decides the answer to each verified request (default 204). */
  answer: (webhook: ReceivedWebhook) => WebhookAnswer;
  /** The first of each webhook-id, in arrival order: what a deduping backend keeps. */
  deduped(): ReceivedWebhook[];
  /** Stops listening: connections are refused until `up()`. */
  down(): Promise<void>;
  up(): Promise<void>;
  close(): Promise<void>;
}

/** A key of 24 random-looking bytes, as `whsec_<base64>`. */
export function webhookSecret(seed: string): string {
  return `whsec_${Buffer.from(seed.padEnd(24, '.').slice(0, 24)).toString('base64')}`;
}

export async function startWebhookReceiver(
  options: { path?: string; seed?: string } = {},
): Promise<WebhookReceiver> {
  const secret = webhookSecret(options.seed ?? 'receiver');
  const verifier = new Webhook(secret);
  const path = options.path ?? '/hooks';
  const hanging = new Set<ServerResponse>();
  let server: Server;
  let port = 0;

  const receiver: WebhookReceiver = {
    url: '',
    secret,
    received: [],
    rejected: 0,
    answer: () => 204,
    deduped() {
      const seen = new Set<string>();
      return receiver.received.filter((webhook) => {
        if (seen.has(webhook.id)) return false;
        seen.add(webhook.id);
        return true;
      });
    },
    down: () => stop(),
    up: () => listen(),
    async close() {
      await stop();
    },
  };

  const handle = (request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      let body: WebhookBody;
      try {
        body = verifier.verify(raw, {
          'webhook-id': String(request.headers['webhook-id']),
          'webhook-timestamp': String(request.headers['webhook-timestamp']),
          'webhook-signature': String(request.headers['webhook-signature']),
        }) as WebhookBody;
      } catch {
        receiver.rejected += 1;
        response.writeHead(400).end();
        return;
      }
      if (request.url !== path) {
        // A request that followed a redirect lands here: recorded as rejected.
        receiver.rejected += 1;
        response.writeHead(404).end();
        return;
      }
      const webhook: ReceivedWebhook = {
        id: String(request.headers['webhook-id']),
        body,
        bytes: Buffer.byteLength(raw),
        at: Date.now(),
      };
      receiver.received.push(webhook);
      const answer = receiver.answer(webhook);
      if (answer === 'hang') {
        hanging.add(response);
        return;
      }
      if (answer >= 300 && answer < 400) {
        response.writeHead(answer, { location: `${receiver.url}/moved` }).end();
        return;
      }
      response.writeHead(answer).end();
    });
  };

  const listen = () =>
    new Promise<void>((resolve, reject) => {
      server = createServer(handle);
      server.keepAliveTimeout = 1_000;
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        port = (server.address() as AddressInfo).port;
        receiver.url = `http://127.0.0.1:${port}${path}`;
        resolve();
      });
    });
  const stop = () =>
    new Promise<void>((resolve) => {
      for (const response of hanging) response.destroy();
      hanging.clear();
      server.closeAllConnections();
      server.close(() => resolve());
    });

  await listen();
  return receiver;
}
