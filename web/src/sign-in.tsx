// Sign-in: a development token from the service (when it hands them out), or
// a bearer token pasted in.
import { useState } from 'preact/hooks';
import { devTokensEnabled, fetchDevToken, type Session } from './session.js';

export function SignIn(props: {
  reason: string | undefined;
  onSignedIn: (session: Session) => void;
}) {
  const devTokens = devTokensEnabled();
  const [userId, setUserId] = useState('');
  const [pasted, setPasted] = useState('');
  const [error, setError] = useState<string>();
  const [busy, setBusy] = useState(false);

  const signInWithDevToken = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const devUser = userId.trim();
      props.onSignedIn({ token: await fetchDevToken(devUser), devUser });
    } catch (cause) {
      setError(`No development token: ${(cause as Error).message}`);
    } finally {
      setBusy(false);
    }
  };

  const signInWithToken = (event: Event) => {
    event.preventDefault();
    const token = pasted.trim().replace(/^Bearer\s+/i, '');
    if (token) props.onSignedIn({ token });
  };

  return (
    <main class="sign-in" aria-labelledby="sign-in-title">
      <h1 id="sign-in-title">Conversations</h1>
      <p class="lead">Talk to the agents of this conversation service.</p>
      {props.reason && (
        <p class="banner banner-warning" role="alert">
          {props.reason}
        </p>
      )}
      {error && (
        <p class="banner banner-error" role="alert">
          {error}
        </p>
      )}
      {devTokens && (
        <form class="card" onSubmit={(event) => void signInWithDevToken(event)}>
          <h2>Development</h2>
          <label for="dev-user">User id (optional)</label>
          <input
            id="dev-user"
            value={userId}
            autoComplete="username"
            placeholder="demo-user"
            onInput={(event) => setUserId(event.currentTarget.value)}
          />
          <button type="submit" class="primary" disabled={busy}>
            Sign in with a development token
          </button>
        </form>
      )}
      <form class="card" onSubmit={signInWithToken}>
        <h2>{devTokens ? 'Or use a token' : 'Sign in'}</h2>
        <label for="pasted-token">Bearer token</label>
        <textarea
          id="pasted-token"
          rows={3}
          spellcheck={false}
          autoComplete="off"
          value={pasted}
          onInput={(event) => setPasted(event.currentTarget.value)}
        />
        <button type="submit" disabled={!pasted.trim()}>
          Sign in with this token
        </button>
      </form>
    </main>
  );
}
