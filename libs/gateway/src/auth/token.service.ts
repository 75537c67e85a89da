import { createHash } from 'node:crypto';
import { Inject, Injectable } from '@nestjs/common';
import {
  SignJWT,
  createRemoteJWKSet,
  errors as joseErrors,
  jwtVerify,
  type JWTVerifyGetKey,
} from 'jose';
import { LRUCache } from 'lru-cache';
import type { AppConfig } from '@cs/config';
import { DomainError } from '@cs/core';
import { TokenClaimsSchema } from '@cs/protocol';
import { APP_CONFIG } from '../tokens.js';
import type { Principal } from './principal.js';

export class UnauthorizedError extends DomainError {
  constructor(message = 'a valid bearer token is required') {
    super('UNAUTHORIZED', message);
  }
}

/** Development tokens last a day, or `AUTH_MAX_TOKEN_TTL_S` when that is shorter. */
const DEV_TOKEN_TTL_S = 86_400;
const CLOCK_TOLERANCE_S = 30;
const MAX_TOKEN_CHARS = 8192;
/**
 * Tokens verified lately, by their SHA-256, so that a client's next request
 * does not check the signature again (WebCrypto's HMAC was an eighth of a
 * gateway's CPU under REST load). An entry lasts until its token expires, and
 * a minute at most: a key withdrawn from the JWKS stops being accepted within
 * that. Only verified tokens are kept, so the bound is on real clients.
 */
const VERIFIED_MAX = 10_000;
const VERIFIED_TTL_MS = 60_000;

/** What a verified token says, kept for its next use. */
interface VerifiedClaims {
  tenantId: string;
  userId: string;
  roles: readonly string[];
  /** `exp`, in ms. */
  exp: number;
}

/**
 * Verifies bearer JWTs (HS256 with a shared secret, or RS256/ES256 keys from a
 * JWKS URL) and issues development tokens when they are enabled.
 */
@Injectable()
export class TokenService {
  private readonly secret: Uint8Array | undefined;
  private readonly jwks: JWTVerifyGetKey | undefined;
  private readonly verified = new LRUCache<string, VerifiedClaims>({ max: VERIFIED_MAX });

  constructor(@Inject(APP_CONFIG) private readonly config: AppConfig) {
    const { jwtSecret, jwksUrl } = config.auth;
    this.secret = jwtSecret ? new TextEncoder().encode(jwtSecret) : undefined;
    this.jwks = jwksUrl ? createRemoteJWKSet(new URL(jwksUrl)) : undefined;
  }

  get devTokensEnabled(): boolean {
    return this.config.auth.devTokens && this.secret !== undefined;
  }

  async verify(token: unknown): Promise<Principal> {
    if (typeof token !== 'string' || token.length === 0 || token.length > MAX_TOKEN_CHARS) {
      throw new UnauthorizedError();
    }
    const key = createHash('sha256').update(token).digest('base64');
    const seen = this.verified.get(key);
    if (seen) return principalOf(seen, Date.now());
    const claims = await this.verifySignature(token);
    const ttl = Math.min(VERIFIED_TTL_MS, claims.exp + CLOCK_TOLERANCE_S * 1000 - Date.now());
    if (ttl > 0) this.verified.set(key, claims, { ttl });
    return principalOf(claims, Date.now());
  }

  /** The full check of a token: signature, issuer, audience, times, claims. */
  private async verifySignature(token: string): Promise<VerifiedClaims> {
    const options = {
      issuer: this.config.auth.issuer,
      audience: this.config.auth.audience,
      clockTolerance: CLOCK_TOLERANCE_S,
      requiredClaims: ['exp'],
    };
    let payload: unknown;
    try {
      if (this.secret) {
        ({ payload } = await jwtVerify(token, this.secret, { ...options, algorithms: ['HS256'] }));
      } else if (this.jwks) {
        ({ payload } = await jwtVerify(token, this.jwks, {
          ...options,
          algorithms: ['RS256', 'ES256'],
        }));
      } else {
        throw new UnauthorizedError('no token verification key is configured');
      }
    } catch (error) {
      if (error instanceof UnauthorizedError) throw error;
      throw new UnauthorizedError(
        error instanceof joseErrors.JWTExpired ? 'the token has expired' : 'the token is invalid',
      );
    }
    const claims = TokenClaimsSchema.safeParse(payload);
    if (!claims.success) throw new UnauthorizedError('the token lacks a valid sub, tid or exp');
    const exp = claims.data.exp * 1000;
    // A token that lasts longer than the operator allows is refused, however it was signed
    // (the tolerance covers an issuer whose clock runs ahead of this one).
    const { maxTokenTtlS } = this.config.auth;
    if (exp > Date.now() + (maxTokenTtlS + CLOCK_TOLERANCE_S) * 1000) {
      throw new UnauthorizedError(`the token lasts longer than ${maxTokenTtlS} s`);
    }
    return {
      tenantId: claims.data.tid,
      userId: claims.data.sub,
      roles: claims.data.roles ?? [],
      exp,
    };
  }

  /** A development token (HS256, 24 h at most); only when `AUTH_DEV_TOKENS` is on. */
  async issueDevToken(input: {
    userId: string;
    tenantId: string;
    roles: string[];
  }): Promise<string> {
    if (!this.devTokensEnabled || !this.secret)
      throw new UnauthorizedError('dev tokens are disabled');
    let jwt = new SignJWT({ tid: input.tenantId, roles: input.roles })
      .setProtectedHeader({ alg: 'HS256' })
      .setSubject(input.userId)
      .setIssuedAt()
      .setExpirationTime(
        Math.floor(Date.now() / 1000) + Math.min(DEV_TOKEN_TTL_S, this.config.auth.maxTokenTtlS),
      );
    if (this.config.auth.issuer) jwt = jwt.setIssuer(this.config.auth.issuer);
    if (this.config.auth.audience) jwt = jwt.setAudience(this.config.auth.audience);
    return jwt.sign(this.secret);
  }
}

/**
 * The principal of a verified token at `now`, or a refusal once the token has
 * expired (past its tolerance: as `jwtVerify` would refuse it).
 */
function principalOf(claims: VerifiedClaims, now: number): Principal {
  const { exp, roles } = claims;
  if (now > exp + CLOCK_TOLERANCE_S * 1000) throw new UnauthorizedError('the token has expired');
  return {
    tenantId: claims.tenantId,
    userId: claims.userId,
    roles,
    isAdmin: roles.includes('admin'),
    // A token taken past its exp (within the tolerance) lasts to the tolerance's end,
    // as it does for REST: a socket it opens is not closed the moment it opens.
    expiresAt: exp > now ? exp : exp + CLOCK_TOLERANCE_S * 1000,
  };
}

/** Reads `Authorization: Bearer <token>`; tokens in URLs are never accepted. */
export function bearerToken(header: string | string[] | undefined): string | undefined {
  if (typeof header !== 'string') return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}
