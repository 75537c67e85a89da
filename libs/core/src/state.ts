import type { ConversationRecord, StateDelta } from './conversation.js';

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

/** Keys another conversation may change: `app:` and `user:` keys. */
export function isSharedKey(key: string): boolean {
  return key.startsWith(APP_PREFIX) || key.startsWith(USER_PREFIX);
}

/**
 * A conversation stored `app:` keys (shared by every conversation of its app
 * in its tenant) or `user:` keys (shared by its user's conversations in that
 * app): the running conversations that share them hold an old copy until
 * they read them again.
 */
export interface ScopedStateChange {
  tenantId: string;
  appName: string;
  userId: string;
  app: boolean;
  user: boolean;
  /** The conversation that stored them: its own copy is up to date. */
  origin: string;
}

type ScopeOwner = Pick<ConversationRecord, 'id' | 'tenantId' | 'appName' | 'userId'>;

/** The change that storing these drafts makes, or null when they hold no `app:` or `user:` key. */
export function scopedStateChangeOf(
  conversation: ScopeOwner,
  drafts: Iterable<{ stateDelta?: StateDelta }>,
): ScopedStateChange | null {
  let app = false;
  let user = false;
  for (const { stateDelta } of drafts) {
    if (!stateDelta) continue;
    const scoped = splitStateDelta(stateDelta);
    app ||= !isEmptyDelta(scoped.app);
    user ||= !isEmptyDelta(scoped.user);
  }
  if (!app && !user) return null;
  const { id, tenantId, appName, userId } = conversation;
  return { tenantId, appName, userId, app, user, origin: id };
}

/**
 * Whether another conversation's change may leave this conversation's copy
 * of its `app:` and `user:` keys behind. `appName` is null before the
 * conversation is read: any app may be its own then.
 */
export function outdatesScopes(
  change: ScopedStateChange,
  conversation: Omit<ScopeOwner, 'appName'> & { appName: string | null },
): boolean {
  if (change.origin === conversation.id || change.tenantId !== conversation.tenantId) return false;
  if (conversation.appName !== null && change.appName !== conversation.appName) return false;
  return change.app || (change.user && change.userId === conversation.userId);
}
