// Who is signed in: the bearer token (kept in localStorage, so that a reload or
// a second tab stays signed in) and, for a development token, what to ask
// `POST /api/dev/token` for when the token has to be renewed.

export interface Session {
  token: string;
  /** Set when the token is a development token: renewed by asking for another. */
  devUser?: string;
}

const STORAGE_KEY = 'cs.session';

export function loadSession(): Session | null {
  try {
    const parsed = JSON.parse(localStorage.getItem(STORAGE_KEY) ?? 'null') as unknown;
    if (typeof parsed !== 'object' || parsed === null) return null;
    const { token, devUser } = parsed as Record<string, unknown>;
    if (typeof token !== 'string' || token === '') return null;
    return typeof devUser === 'string' ? { token, devUser } : { token };
  } catch {
    return null;
  }
}

export function saveSession(session: Session): void {
  localStorage.setItem(STORAGE_KEY, JSON.stringify(session));
}

export function clearSession(): void {
  localStorage.removeItem(STORAGE_KEY);
}

/**
 * Whether this service hands out development tokens: the page it served says
 * so (its `cs-dev-tokens` meta tag), so that no request is made to find out.
 */
export function devTokensEnabled(): boolean {
  return document.querySelector<HTMLMetaElement>('meta[name="cs-dev-tokens"]')?.content === 'on';
}

export async function fetchDevToken(userId: string): Promise<string> {
  const response = await fetch('/api/dev/token', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(userId ? { user_id: userId } : {}),
  });
  const body = (await response.json().catch(() => null)) as {
    token?: unknown;
    error?: { message?: unknown };
  } | null;
  if (!response.ok || typeof body?.token !== 'string') {
    const message = typeof body?.error?.message === 'string' ? body.error.message : '';
    throw new Error(message || `the service answered ${response.status}`);
  }
  return body.token;
}

/** The `sub` and `tid` of a JWT, for display only (the server checks the token). */
export function tokenIdentity(token: string): { user?: string; tenant?: string } {
  try {
    const payload = token.split('.')[1] ?? '';
    const json = atob(payload.replace(/-/g, '+').replace(/_/g, '/'));
    const claims = JSON.parse(json) as Record<string, unknown>;
    return {
      ...(typeof claims.sub === 'string' ? { user: claims.sub } : {}),
      ...(typeof claims.tid === 'string' ? { tenant: claims.tid } : {}),
    };
  } catch {
    return {};
  }
}
