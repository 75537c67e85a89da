// The web app's built files (dist/web) at `/`, under a Content-Security-Policy
// that lets the page load nothing from another origin: agent Markdown is
// rendered into it, and an image or script pointing elsewhere could carry the
// conversation away (web/src/markdown.ts turns images into links; this is the
// second line). The service's own paths are never answered from the files, so
// `/api/conversations/..%2f..%2findex.html` is the API's JSON 404, not the page.
import type { IncomingMessage } from 'node:http';
import { posix } from 'node:path';
import express, {
  type NextFunction,
  type Request,
  type RequestHandler,
  type Response,
} from 'express';
import helmet from 'helmet';

/** Path prefixes the API, Socket.IO, the OpenAPI pages and the probes answer. */
export const SERVICE_PATHS = [
  '/api',
  '/socket.io',
  '/docs',
  '/docs-json',
  '/healthz',
  '/readyz',
  '/metrics',
];

/** `host[:port]` or `[ipv6][:port]`: anything else is left out of the policy. */
const HOST = /^(?:[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::\d{1,5})?$/i;

/**
 * The page's own origin for everything; a data: URL for the favicon; the
 * socket of the same origin (CSP 3 browsers count it in 'self', older ones
 * need it named, and the client uses WebSocket only). No plugins, frames,
 * <base>, or embedding by other sites.
 */
const headers = helmet({
  contentSecurityPolicy: {
    useDefaults: false,
    directives: {
      defaultSrc: ["'self'"],
      scriptSrc: ["'self'"],
      scriptSrcAttr: ["'none'"],
      styleSrc: ["'self'"],
      imgSrc: ["'self'", 'data:'],
      fontSrc: ["'self'"],
      connectSrc: ["'self'", sameOriginSocket],
      objectSrc: ["'none'"],
      frameSrc: ["'none'"],
      baseUri: ["'none'"],
      formAction: ["'self'"],
      frameAncestors: ["'none'"],
    },
  },
  xFrameOptions: { action: 'deny' },
  // Whether the service is reached over TLS, and for how long browsers must
  // insist on it, is the operator's decision (at the TLS proxy), not the app's.
  strictTransportSecurity: false,
});

function sameOriginSocket(request: IncomingMessage): string {
  const host = request.headers.host ?? '';
  return HOST.test(host) ? `ws://${host} wss://${host}` : '';
}

/** Serves the files in `dir` (index.html at `/`) on any path the service does not own. */
export function webAppAssets(dir: string): RequestHandler {
  const files = express.static(dir, { index: 'index.html', redirect: false });
  return (request: Request, response: Response, next: NextFunction): void => {
    if (isServicePath(request.path)) return next();
    headers(request, response, (error?: unknown) => {
      if (error) return next(error);
      files(request, response, next);
    });
  };
}

/**
 * Whether the path lies under a service path: as it is, once decoded (with
 * repeated slashes as one), or once normalised as the file server would read
 * it; matched without regard to case, as the router matches routes.
 */
export function isServicePath(path: string): boolean {
  let decoded: string;
  try {
    decoded = decodeURIComponent(path).replace(/\/{2,}/g, '/');
  } catch {
    return true; // no file has that name either: the router answers it
  }
  return [path, decoded, posix.normalize(decoded)].some((candidate) => {
    const lower = candidate.toLowerCase();
    return SERVICE_PATHS.some((prefix) => lower === prefix || lower.startsWith(`${prefix}/`));
  });
}
