/**
 * While development tokens are on, the service answers only requests that
 * name it by a loopback name or address, or by the host of an origin the
 * operator listed in `CORS_ORIGINS` (docs/protocol.md, `AUTH_DEV_TOKENS`). A page
 * whose DNS name an attacker rebinds to 127.0.0.1 is same-origin to the
 * browser, and could otherwise mint an `admin` token for any tenant with
 * `POST /api/dev/token`; its requests carry the attacker's name in `Host`.
 */
import { BadRequestError } from '@cs/core';

/** The loopback names and addresses, as a `Host` header's host (lower case, IPv6 in brackets). */
const LOOPBACK_HOSTS = ['localhost', '127.0.0.1', '[::1]'];

/**
 * Paths probes and scrapers reach by address (a pod's IP in Kubernetes):
 * they hold no tenant data and take no token, so no name is required.
 */
const ADDRESS_PATHS = new Set(['/healthz', '/readyz', '/metrics']);

/** `host[:port]` with a DNS name, an IPv4 address or a bracketed IPv6 address; nothing else. */
const HOST_HEADER = /^(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::\d{1,5})?$/;

export class DevTokenHosts {
  private readonly allowed: ReadonlySet<string>;

  constructor(corsOrigins: readonly string[]) {
    const named = corsOrigins.flatMap((origin) => {
      try {
        return [new URL(origin).hostname.toLowerCase()];
      } catch {
        return [];
      }
    });
    this.allowed = new Set([...LOOPBACK_HOSTS, ...named]);
  }

  /** Whether a request with this `Host` header (any port) may be served. */
  allows(host: string | undefined): boolean {
    const match = HOST_HEADER.exec((host ?? '').toLowerCase());
    return match?.[1] !== undefined && this.allowed.has(match[1]);
  }

  /** Whether a request for `path` is served whatever its `Host` (probes, metrics). */
  static servesAnyHost(path: string): boolean {
    return ADDRESS_PATHS.has(path);
  }

  /** The refusal of a request whose `Host` is not allowed: 400 `BAD_REQUEST`, field `Host`. */
  static refusal(): BadRequestError {
    return new BadRequestError(
      'while development tokens are on, the service answers only at localhost, 127.0.0.1, [::1] or a host of CORS_ORIGINS',
      'Host',
    );
  }
}
