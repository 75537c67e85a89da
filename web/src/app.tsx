// The web app: sign-in, then the conversation list beside the open
// conversation (`#/c/<id>` in the address, so that a reload or a link opens it).
import { useCallback, useEffect, useMemo, useState } from 'preact/hooks';
import { createClient, type ConversationInfo } from '@cs/client';
import { ChatView } from './chat-view.js';
import { ConversationList } from './conversation-list.js';
import {
  clearSession,
  fetchDevToken,
  loadSession,
  saveSession,
  tokenIdentity,
  type Session,
} from './session.js';
import { SignIn } from './sign-in.js';

function routeId(): string | null {
  const match = /^#\/c\/([0-9a-fA-F-]{36})$/.exec(location.hash);
  return match?.[1] ?? null;
}

export function App() {
  const [session, setSession] = useState<Session | null>(loadSession);
  const [reason, setReason] = useState<string>();
  const [openId, setOpenId] = useState<string | null>(routeId);
  const [overlay, setOverlay] = useState<ReadonlyMap<string, Partial<ConversationInfo>>>(new Map());
  const [listVersion, setListVersion] = useState(0);

  useEffect(() => {
    const onHash = () => setOpenId(routeId());
    addEventListener('hashchange', onHash);
    return () => removeEventListener('hashchange', onHash);
  }, []);

  // Another tab signed in or out: follow it.
  useEffect(() => {
    const onStorage = () => setSession(loadSession());
    addEventListener('storage', onStorage);
    return () => removeEventListener('storage', onStorage);
  }, []);

  const token = session?.token;
  const devUser = session?.devUser;
  const identity = devUser ?? token;
  const client = useMemo(() => {
    if (token === undefined) return null;
    return createClient({
      url: location.origin,
      token,
      // A development token is renewed by asking for another; a pasted one cannot be.
      ...(devUser === undefined
        ? {}
        : {
            getToken: async () => {
              const fresh = await fetchDevToken(devUser);
              saveSession({ token: fresh, devUser });
              return fresh;
            },
          }),
    });
    // The client lives as long as the sign-in (a renewed token does not replace it).
  }, [identity]);

  const signOut = useCallback((why?: string) => {
    clearSession();
    setSession(null);
    setReason(why);
  }, []);

  const open = useCallback((id: string | null) => {
    location.hash = id ? `#/c/${id}` : '';
    setOpenId(id);
  }, []);

  const onInfo = useCallback((id: string, patch: Partial<ConversationInfo>) => {
    setOverlay((current) => new Map(current).set(id, { ...current.get(id), ...patch }));
  }, []);

  useEffect(() => {
    if (openId) setListVersion((v) => v + 1);
  }, [openId]);

  if (!session || !client) {
    return (
      <SignIn
        reason={reason}
        onSignedIn={(next) => {
          saveSession(next);
          setReason(undefined);
          setSession(next);
        }}
      />
    );
  }

  const who = tokenIdentity(session.token);
  return (
    <div class="app" data-view={openId ? 'chat' : 'list'}>
      <a
        class="skip-link"
        href="#message"
        onClick={(event) => {
          // Not a hash change: the address names the open conversation.
          event.preventDefault();
          document.getElementById('message')?.focus();
        }}
      >
        Skip to the message box
      </a>
      <header class="topbar">
        <h1>Conversations</h1>
        <p class="who">
          {who.user ? `Signed in as ${who.user}` : 'Signed in'}
          {who.tenant ? ` (${who.tenant})` : ''}
        </p>
        <button type="button" class="small" onClick={() => signOut()}>
          Sign out
        </button>
      </header>
      <div class="layout">
        <ConversationList
          client={client}
          openId={openId}
          overlay={overlay}
          version={listVersion}
          onOpen={open}
          onUnauthorized={signOut}
        />
        <main class="main">
          {openId ? (
            <ChatView
              key={openId}
              client={client}
              id={openId}
              onInfo={onInfo}
              onBack={() => open(null)}
              onOpen={open}
              onUnauthorized={signOut}
            />
          ) : (
            <div class="placeholder">
              <h2>No conversation open</h2>
              <p>Pick one from the list, or start a new conversation.</p>
            </div>
          )}
        </main>
      </div>
    </div>
  );
}
