import type { ErrorCode } from '@cs/protocol';

/**
 * The typed errors of the domain. Each carries a docs/protocol.md error code; the
 * gateway maps them to HTTP statuses and socket acknowledgements in one place.
 */
export class DomainError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly field?: string,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

export class BadRequestError extends DomainError {
  constructor(message: string, field?: string) {
    super('BAD_REQUEST', message, field);
  }
}

export class NotFoundError extends DomainError {
  constructor(message = 'conversation not found') {
    super('NOT_FOUND', message);
  }
}

export class ConflictError extends DomainError {
  constructor(message: string) {
    super('CONFLICT', message);
  }
}

/** A message sent while a turn runs, to a conversation whose strategy is `reject`. */
export class AgentBusyError extends DomainError {
  constructor() {
    super('AGENT_BUSY', 'the agent is busy with another message');
  }
}

export class ConcurrencyLimitError extends DomainError {
  constructor(limit: number) {
    super(
      'CONCURRENCY_LIMIT_REACHED',
      `at most ${limit} ${limit === 1 ? 'conversation' : 'conversations'} may run at once per user`,
    );
  }
}

/** Whole seconds, at least 1, of a wait in ms (HTTP's `Retry-After`). */
const wholeSeconds = (ms: number | null): number | null =>
  ms === null ? null : Math.max(1, Math.ceil(ms / 1000));

export class RateLimitedError extends DomainError {
  /** Whole seconds until a retry can be taken; null when unknown or never. */
  readonly retryAfterSeconds: number | null;

  constructor(message = 'too many user actions; slow down', retryAfterMs: number | null = null) {
    super('RATE_LIMITED', message);
    this.retryAfterSeconds = wholeSeconds(retryAfterMs);
  }

  /** The user action limit's refusal, saying when a retry is taken. */
  static forActions(retryAfterMs: number | null): RateLimitedError {
    const seconds = wholeSeconds(retryAfterMs);
    const when =
      seconds === null ? 'more actions than the limit allows at once' : `retry in ${seconds} s`;
    return new RateLimitedError(`too many user actions; ${when}`, retryAfterMs);
  }
}

export class UnavailableError extends DomainError {
  constructor(message = 'service unavailable') {
    super('UNAVAILABLE', message);
  }
}

/**
 * A write carried a lease epoch older than the conversation's: another holder
 * owns the conversation now. The session that gets it must stop writing at once.
 */
export class LeaseLostError extends Error {
  constructor(
    readonly conversationId: string,
    readonly epoch: number,
    readonly currentEpoch: number,
  ) {
    super(`lease of ${conversationId} lost: epoch ${epoch} < ${currentEpoch}`);
    this.name = 'LeaseLostError';
  }
}
