// Which errors say that Postgres or Redis cannot be reached right now, as
// opposed to a bug: the contract answers the first 503 `UNAVAILABLE` (clients
// and load balancers retry it) and keeps 500 for the second. Recognised by
// shape only (codes, names, the drivers' own messages), so that no driver is
// imported here; only connection-level failures count, never an SQL error.

/** What a client is told: nothing about which dependency, nor why. */
export const INFRASTRUCTURE_UNAVAILABLE_MESSAGE =
  'a service this request needs is unreachable; try again shortly';

/** Node's codes for a connection that could not be made, or broke. */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/**
 * Postgres SQLSTATEs of a server that cannot serve now: class 08 (connection
 * exception) is matched as a class; the server shutting down or starting
 * (57P01-57P03) and every connection slot taken (53300).
 */
const POSTGRES_STATES = new Set(['57P01', '57P02', '57P03', '53300']);

/** pg's and pg-pool's own errors when the connection failed, broke or timed out. */
const POSTGRES_MESSAGES = new Set([
  'Connection terminated unexpectedly',
  'Connection terminated',
  'Connection terminated due to connection timeout',
  'timeout exceeded when trying to connect',
  'timeout expired',
  'Query read timeout',
  'Client has encountered a connection error and is not queryable',
  'Client was closed and is not queryable',
  'Cannot use a pool after calling end on the pool',
]);

/** ioredis' own errors when a command could not be sent, or its connection went. */
const REDIS_MESSAGES = new Set([
  "Stream isn't writeable and enableOfflineQueue options is false",
  'Connection is closed.',
  'Command timed out',
  'Command aborted due to connection close',
]);

/**
 * ioredis' cluster client when it cannot reach the slot's master: no node
 * answers, its slot map could not be read, or a failover kept answering
 * MOVED/ASK/TRYAGAIN/CLUSTERDOWN past its redirections (the last reply
 * follows this text).
 */
const REDIS_CLUSTER_MESSAGE_PREFIXES = [
  'None of startup nodes is available',
  'Failed to refresh slots cache',
  "Cluster isn't ready and enableOfflineQueue options is false",
  'Cluster is disconnected.',
  'Node is disconnected',
  'Too many Cluster redirections.',
  'No sharded subscriber for slot',
];

/** Replies of a Redis that cannot serve now (loading, failing over, busy with a script). */
const REDIS_REPLY_PREFIXES = [
  'LOADING ',
  'BUSY ',
  'MASTERDOWN ',
  'READONLY ',
  'TRYAGAIN ',
  'CLUSTERDOWN ',
];

interface ErrorShape {
  name?: unknown;
  message?: unknown;
  code?: unknown;
  errors?: unknown;
  cause?: unknown;
}

/**
 * True when `error` (or what it wraps, through `cause` or an
 * `AggregateError`'s attempts) says Postgres or Redis is unreachable.
 */
export function isInfrastructureUnavailable(error: unknown, depth = 0): boolean {
  if (!error || typeof error !== 'object' || depth > 4) return false;
  const { name, message, code, errors, cause } = error as ErrorShape;
  if (typeof code === 'string' && (NETWORK_CODES.has(code) || isUnavailablePostgresState(code))) {
    return true;
  }
  if (name === 'MaxRetriesPerRequestError' || name === 'ClusterAllFailedError') return true;
  if (typeof message === 'string') {
    if (POSTGRES_MESSAGES.has(message) || REDIS_MESSAGES.has(message)) return true;
    if (REDIS_CLUSTER_MESSAGE_PREFIXES.some((p) => message.startsWith(p))) return true;
    if (name === 'ReplyError' && REDIS_REPLY_PREFIXES.some((p) => message.startsWith(p))) {
      return true;
    }
  }
  // Node tries each address of a host (IPv4, IPv6): every attempt failed.
  if (Array.isArray(errors) && errors.length > 0) {
    return errors.every((inner) => isInfrastructureUnavailable(inner, depth + 1));
  }
  return isInfrastructureUnavailable(cause, depth + 1);
}

function isUnavailablePostgresState(code: string): boolean {
  return /^08[0-9A-Z]{3}$/.test(code) || POSTGRES_STATES.has(code);
}
