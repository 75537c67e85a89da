import type { StateDelta } from './conversation.js';

/** State scopes, as in Google ADK's session state. */
export const APP_PREFIX = 'app:';
export const USER_PREFIX = 'user:';
export const TEMP_PREFIX = 'temp:';

/** A state delta split by scope, prefixes removed; `temp:` keys dropped. */
export interface ScopedStateDelta {
  app: StateDelta;
  user: StateDelta;
  conversation: StateDelta;
}

export function splitStateDelta(delta: StateDelta | undefined): ScopedStateDelta {
  const scoped: ScopedStateDelta = { app: {}, user: {}, conversation: {} };
  for (const [key, value] of Object.entries(delta ?? {})) {
    if (value === undefined || key.startsWith(TEMP_PREFIX)) continue;
    if (key.startsWith(APP_PREFIX)) scoped.app[key.slice(APP_PREFIX.length)] = value;
    else if (key.startsWith(USER_PREFIX)) scoped.user[key.slice(USER_PREFIX.length)] = value;
    else scoped.conversation[key] = value;
  }
  return scoped;
}

export function isEmptyDelta(delta: StateDelta): boolean {
  return Object.keys(delta).length === 0;
}

/** Applies a delta to one scope's state: `null` deletes a key. */
export function applyDelta(
  state: Record<string, unknown>,
  delta: StateDelta,
): Record<string, unknown> {
  const next = { ...state };
  for (const [key, value] of Object.entries(delta)) {
    if (value === null) delete next[key];
    else next[key] = value;
  }
  return next;
}

/** The merged view an agent sees: app and user keys carry their prefix back. */
export function mergeScopes(scopes: {
  app: Record<string, unknown>;
  user: Record<string, unknown>;
  conversation: Record<string, unknown>;
}): Record<string, unknown> {
  const merged: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(scopes.app)) merged[APP_PREFIX + key] = value;
  for (const [key, value] of Object.entries(scopes.user)) merged[USER_PREFIX + key] = value;
  for (const [key, value] of Object.entries(scopes.conversation)) merged[key] = value;
  return merged;
}
