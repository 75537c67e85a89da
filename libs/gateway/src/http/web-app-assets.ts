// The web app's built files (dist/web) at `/`, under a Content-Security-Policy
// that lets the page load nothing from another origin: agent Markdown is
// rendered into it, and an image or script pointing elsewhere could carry the
// conversation away (web/src/markdown.ts turns images into links; this is the
// second line). The service's own paths are never answered from the files, so
// `/api/conversations/..%2f..%2findex.html` is the API's JSON 404, not the page.
// The page says whether the service hands out development tokens (its
// `cs-dev-tokens` meta tag), so that it shows that sign-in without asking for
// a token on each load, a 404 in the browser's console where they are off.
import { readFile } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { join, posix } from 'node:path';
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

/** What the page is told about the service it is served by. */
export interface WebAppSettings {
  devTokens: boolean;
}

const DEV_TOKENS_META = /<meta name="cs-dev-tokens" content="[a-z]*"/;

/**
 * Serves the files in `dir` on any path the service does not own; index.html
 * (at `/` too) with `settings` written into it.
 */
export function webAppAssets(dir: string, settings: WebAppSettings): RequestHandler {
  const files = express.static(dir, { index: false, redirect: false });
  const meta = `<meta name="cs-dev-tokens" content="${settings.devTokens ? 'on' : 'off'}"`;
  const page = (response: Response, next: NextFunction) => {
    // Read on each request: a rebuild of the web app is served without a restart.
    readFile(join(dir, 'index.html'), 'utf8').then(
      (html) => {
        response
          .type('html')
          .set('cache-control', 'no-cache')
          .send(html.replace(DEV_TOKENS_META, meta));
      },
      (error: NodeJS.ErrnoException) => next(error.code === 'ENOENT' ? undefined : error),
    );
  };
  return (request: Request, response: Response, next: NextFunction): void => {
    if (isServicePath(request.path)) return next();
    headers(request, response, (error?: unknown) => {
      if (error) return next(error);
      const isPage = request.path === '/' || request.path === '/index.html';
      if (isPage && (request.method === 'GET' || request.method === 'HEAD')) page(response, next);
      else files(request, response, next);
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
