import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { SignJWT, exportJWK, generateKeyPair, type CryptoKey, type JWTPayload } from 'jose';
import { loadConfig } from '@cs/config';
import { TokenService, UnauthorizedError, bearerToken } from './token.service.js';

const SECRET = 'a-secret-of-at-least-16-chars';

type SigningKey = CryptoKey | Uint8Array;

function token(
  key: SigningKey,
  alg: string,
  claims: JWTPayload = { tid: 'tenant-1' },
  options: { kid?: string; sub?: string; exp?: number | string | null } = {},
): Promise<string> {
  let jwt = new SignJWT(claims)
    .setProtectedHeader(options.kid ? { alg, kid: options.kid } : { alg })
    .setIssuedAt();
  jwt = jwt.setSubject(options.sub ?? 'user-1');
  const exp = options.exp === undefined ? '5m' : options.exp;
  if (exp !== null) jwt = jwt.setExpirationTime(exp);
  return jwt.sign(key);
}

/** The error `verify` fails with, or a failure of the test when it resolves. */
async function refusal(tokens: TokenService, value: unknown): Promise<UnauthorizedError> {
  const error: unknown = await tokens.verify(value).then(
    () => new Error('the token was accepted'),
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(UnauthorizedError);
  return error as UnauthorizedError;
}

describe(TokenService.name, () => {
  describe('with AUTH_JWT_SECRET (HS256)', () => {
    const secret = new TextEncoder().encode(SECRET);
    const tokens = new TokenService(
      loadConfig('gateway', { ...clusterEnv(), AUTH_JWT_SECRET: SECRET }),
    );

    it('reads the tenant, the user and the roles of a valid token', async () => {
      const principal = await tokens.verify(
        await token(secret, 'HS256', { tid: 'tenant-1', roles: ['admin'] }),
      );
      expect(principal).toEqual({
        tenantId: 'tenant-1',
        userId: 'user-1',
        roles: ['admin'],
        isAdmin: true,
        expiresAt: expect.any(Number),
      });
    });

    it('accepts a token expired less than 30 s ago and refuses one expired longer ago', async () => {
      const now = Math.floor(Date.now() / 1000);
      // Taken past its exp, it lasts to the end of the tolerance, not a moment.
      await expect(
        tokens.verify(await token(secret, 'HS256', undefined, { exp: now - 10 })),
      ).resolves.toMatchObject({ userId: 'user-1', expiresAt: (now - 10 + 30) * 1000 });
      // Before its exp, it lasts to its exp.
      await expect(
        tokens.verify(await token(secret, 'HS256', undefined, { exp: now + 60 })),
      ).resolves.toMatchObject({ expiresAt: (now + 60) * 1000 });
      const error = await refusal(
        tokens,
        await token(secret, 'HS256', undefined, { exp: now - 60 }),
      );
      expect(error.message).toBe('the token has expired');
    });

    describe('verifying a token once while it is reused', () => {
      afterEach(() => {
        vi.restoreAllMocks();
        vi.useRealTimers();
      });
      /** A service of its own, whose full checks of a signature are counted. */
      function countedService() {
        const service = new TokenService(
          loadConfig('gateway', { ...clusterEnv(), AUTH_JWT_SECRET: SECRET }),
        );
        const checks = vi.spyOn(
          service as unknown as { verifySignature: (token: string) => Promise<unknown> },
          'verifySignature',
        );
        return { service, checks };
      }

      it('checks the signature of a token it accepted once, and of every other token each time', async () => {
        const { service, checks } = countedService();
        const first = await token(secret, 'HS256', { tid: 'tenant-1', roles: ['admin'] });
        const principals = [
          await service.verify(first),
          await service.verify(first),
          await service.verify(first),
        ];
        expect(checks).toHaveBeenCalledTimes(1);
        expect(new Set(principals.map((p) => JSON.stringify(p))).size).toBe(1);
        expect(principals[2]).toMatchObject({ userId: 'user-1', isAdmin: true });

        const other = await token(secret, 'HS256', { tid: 'tenant-2' }, { sub: 'user-2' });
        expect(await service.verify(other)).toMatchObject({
          tenantId: 'tenant-2',
          userId: 'user-2',
        });
        expect(checks).toHaveBeenCalledTimes(2);

        // A refused token is checked again each time: only accepted ones are kept.
        const forged = await token(new TextEncoder().encode('another-secret-of-16-chars'), 'HS256');
        await refusal(service, forged);
        await refusal(service, forged);
        expect(checks).toHaveBeenCalledTimes(4);
      });

      it('refuses a token it accepted before once it has expired past the tolerance', async () => {
        const { service } = countedService();
        const exp = Math.floor(Date.now() / 1000) + 5;
        const soon = await token(secret, 'HS256', undefined, { exp });
        await expect(service.verify(soon)).resolves.toMatchObject({ expiresAt: exp * 1000 });
        vi.useFakeTimers({ toFake: ['Date'] });
        // Within the tolerance, as a first check would accept it: it lasts to the tolerance's end.
        vi.setSystemTime((exp + 10) * 1000);
        await expect(service.verify(soon)).resolves.toMatchObject({
          expiresAt: (exp + 30) * 1000,
        });
        vi.setSystemTime((exp + 31) * 1000);
        expect((await refusal(service, soon)).message).toBe('the token has expired');
      });
    });

    it('refuses tokens without exp, sub or tid, signed with another secret, or not tokens at all', async () => {
      const other = new TextEncoder().encode('another-secret-of-16-chars');
      expect(
        (await refusal(tokens, await token(secret, 'HS256', undefined, { exp: null }))).message,
      ).toBe('the token is invalid');
      expect((await refusal(tokens, await token(secret, 'HS256', {}))).message).toBe(
        'the token lacks a valid sub, tid or exp',
      );
      expect(
        (await refusal(tokens, await token(secret, 'HS256', undefined, { sub: '' }))).message,
      ).toBe('the token lacks a valid sub, tid or exp');
      // Ids Postgres cannot store as they are: a NUL is refused (it was a 500), a lone
      // surrogate becomes U+FFFD (two such users would be one).
      const unstorable = [
        token(secret, 'HS256', undefined, { sub: 'a\u0000' }),
        token(secret, 'HS256', undefined, { sub: 'a\ud800' }),
        token(secret, 'HS256', { tid: 't\u0000' }),
        token(secret, 'HS256', { tid: '\udc00t' }),
      ];
      for (const refused of unstorable) {
        expect((await refusal(tokens, await refused)).message).toBe(
          'the token lacks a valid sub, tid or exp',
        );
      }
      await expect(
        tokens.verify(await token(secret, 'HS256', undefined, { sub: 'emoji-😀' })),
      ).resolves.toMatchObject({ userId: 'emoji-😀' });
      expect((await refusal(tokens, await token(other, 'HS256'))).message).toBe(
        'the token is invalid',
      );
      for (const value of [undefined, '', 42, 'not.a.jwt', 'x'.repeat(9000)]) {
        await refusal(tokens, value);
      }
    });

    it('refuses a blank sub or tid, as an empty one', async () => {
      for (const blank of [
        token(secret, 'HS256', undefined, { sub: ' ' }),
        token(secret, 'HS256', undefined, { sub: '\t \n' }),
        token(secret, 'HS256', { tid: '   ' }),
      ]) {
        expect((await refusal(tokens, await blank)).message).toBe(
          'the token lacks a valid sub, tid or exp',
        );
      }
    });

    it('refuses a token whose exp lies further ahead than AUTH_MAX_TOKEN_TTL_S (default 24 h)', async () => {
      const now = Math.floor(Date.now() / 1000);
      await expect(
        tokens.verify(await token(secret, 'HS256', undefined, { exp: now + 86_400 })),
      ).resolves.toMatchObject({ userId: 'user-1' });
      expect(
        (await refusal(tokens, await token(secret, 'HS256', undefined, { exp: now + 86_400 * 2 })))
          .message,
      ).toBe('the token lasts longer than 86400 s');
      await refusal(
        tokens,
        await token(secret, 'HS256', undefined, { exp: now + 10 * 365 * 86_400 }),
      );

      const short = new TokenService(
        loadConfig('standalone', {
          AUTH_JWT_SECRET: SECRET,
          AUTH_DEV_TOKENS: 'true',
          AUTH_MAX_TOKEN_TTL_S: '600',
        }),
      );
      await expect(
        short.verify(await token(secret, 'HS256', undefined, { exp: now + 300 })),
      ).resolves.toMatchObject({ userId: 'user-1' });
      await refusal(short, await token(secret, 'HS256', undefined, { exp: now + 3_600 }));
      // Its own development tokens stay within the limit.
      const dev = await short.issueDevToken({ userId: 'dev', tenantId: 'tenant-1', roles: [] });
      await expect(short.verify(dev)).resolves.toMatchObject({ userId: 'dev' });
    });

    it('refuses an unsigned token (alg none)', async () => {
      const header = Buffer.from(JSON.stringify({ alg: 'none' })).toString('base64url');
      const body = Buffer.from(
        JSON.stringify({ sub: 'user-1', tid: 'tenant-1', exp: Math.floor(Date.now() / 1000) + 60 }),
      ).toString('base64url');
      await refusal(tokens, `${header}.${body}.`);
    });

    it('checks the issuer and the audience when they are configured', async () => {
      const strict = new TokenService(
        loadConfig('gateway', {
          ...clusterEnv(),
          AUTH_JWT_SECRET: SECRET,
          AUTH_JWT_ISSUER: 'https://issuer.example',
          AUTH_JWT_AUDIENCE: 'conversations',
        }),
      );
      const good = await new SignJWT({ tid: 'tenant-1' })
        .setProtectedHeader({ alg: 'HS256' })
        .setSubject('user-1')
        .setIssuer('https://issuer.example')
        .setAudience('conversations')
        .setExpirationTime('5m')
        .sign(secret);
      await expect(strict.verify(good)).resolves.toMatchObject({ tenantId: 'tenant-1' });
      await refusal(strict, await token(secret, 'HS256'));
    });
  });

  describe('with AUTH_JWKS_URL (RS256, ES256)', () => {
    let server: Server;
    let url: string;
    let rsa: CryptoKey;
    let ec: CryptoKey;
    let unlisted: CryptoKey;
    let requests = 0;

    beforeAll(async () => {
      const rsaPair = await generateKeyPair('RS256');
      const ecPair = await generateKeyPair('ES256');
      rsa = rsaPair.privateKey;
      ec = ecPair.privateKey;
      unlisted = (await generateKeyPair('RS256')).privateKey;
      const keys = [
        { ...(await exportJWK(rsaPair.publicKey)), kid: 'rsa-1', alg: 'RS256', use: 'sig' },
        { ...(await exportJWK(ecPair.publicKey)), kid: 'ec-1', alg: 'ES256', use: 'sig' },
      ];
      server = createServer((_request, response) => {
        requests += 1;
        response.writeHead(200, { 'content-type': 'application/json' });
        response.end(JSON.stringify({ keys }));
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/.well-known/jwks.json`;
    });

    afterAll(async () => {
      await new Promise((resolve) => server.close(resolve));
    });

    const service = (jwksUrl: string) =>
      new TokenService(loadConfig('gateway', { ...clusterEnv(), AUTH_JWKS_URL: jwksUrl }));

    it('accepts RS256 and ES256 tokens signed by keys of the set, fetching the set once', async () => {
      const tokens = service(url);
      const before = requests;
      await expect(
        tokens.verify(await token(rsa, 'RS256', undefined, { kid: 'rsa-1' })),
      ).resolves.toEqual({
        tenantId: 'tenant-1',
        userId: 'user-1',
        roles: [],
        isAdmin: false,
        expiresAt: expect.any(Number),
      });
      await expect(
        tokens.verify(await token(ec, 'ES256', { tid: 'tenant-2' }, { kid: 'ec-1' })),
      ).resolves.toMatchObject({ tenantId: 'tenant-2' });
      expect(requests - before).toBe(1);
    });

    it('refuses a token signed by a key outside the set, and an HS256 token', async () => {
      const tokens = service(url);
      await refusal(tokens, await token(unlisted, 'RS256', undefined, { kid: 'rsa-1' }));
      await refusal(tokens, await token(unlisted, 'RS256', undefined, { kid: 'unknown' }));
      await refusal(tokens, await token(new TextEncoder().encode(SECRET), 'HS256'));
      expect(tokens.devTokensEnabled).toBe(false);
    });

    it('refuses tokens (and does not crash) when the key set cannot be fetched', async () => {
      const closed = createServer();
      await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
      const port = (closed.address() as AddressInfo).port;
      await new Promise((resolve) => closed.close(resolve));
      const tokens = service(`http://127.0.0.1:${port}/jwks.json`);
      const error = await refusal(tokens, await token(rsa, 'RS256', undefined, { kid: 'rsa-1' }));
      expect(error.code).toBe('UNAUTHORIZED');
    });
  });
});

describe(bearerToken.name, () => {
  it('reads the token of an Authorization: Bearer header and nothing else', () => {
    expect(bearerToken('Bearer abc.def.ghi')).toBe('abc.def.ghi');
    expect(bearerToken('bearer   abc ')).toBe('abc');
    expect(bearerToken('Basic abc')).toBeUndefined();
    expect(bearerToken('Bearer a b')).toBeUndefined();
    expect(bearerToken(['Bearer abc'])).toBeUndefined();
    expect(bearerToken(undefined)).toBeUndefined();
  });
});

/** What a gateway needs besides its key. */
function clusterEnv(): Record<string, string> {
  return {
    DATABASE_URL: 'postgres://postgres@127.0.0.1:5432/postgres',
    REDIS_URL: 'redis://127.0.0.1:6379',
  };
}
