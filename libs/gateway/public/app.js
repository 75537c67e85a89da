/* global io */
/*
 * Demo client for the conversation service (contract: PROTOCOL.md). No build step.
 *
 * Flow:
 *  1. Token: POST /api/dev/token (or a pasted JWT) -> localStorage. It is sent as
 *     `Authorization: Bearer` on REST and as `auth: { token }` in the Socket.IO handshake,
 *     never in a URL.
 *  2. Sidebar: GET /api/conversations?limit=20 (+ page_id = next_page_id for "More"),
 *     POST /api/conversations to create, DELETE /api/conversations/:id to delete.
 *  3. Selecting a conversation opens its own Socket.IO connection with query
 *     { conversation_id, latest_event_id }. The server replays stored events after that id,
 *     then sends live ones. Stored events (integer id) are rendered once, in id order, and
 *     cached per conversation; status updates become a banner; stream deltas fill a "typing"
 *     bubble until the stored agent message with the same `cause` arrives.
 *  4. Sending: `oh_user_action` with a client_event_id; re-sending the same unacknowledged
 *     text reuses that id, so a retry never stores the message twice. The ack carries the
 *     stored event id or a typed error.
 *  5. Reconnect: before every reconnect attempt the query's latest_event_id is set to the
 *     last rendered id, so the replay resumes exactly after it (no duplicates, no gaps).
 */

// Browser globals via globalThis, so the file lints with either a node or a browser config.
const { document } = globalThis;

const TOKEN_KEY = 'conversation-demo-token';
const ACK_TIMEOUT_MS = 15000;
const $ = (id) => document.getElementById(id);

const state = {
  token: localStorage.getItem(TOKEN_KEY) || '',
  nextPageId: null,
  conv: null, // ConversationInfo-like object of the open conversation
  socket: null,
  connection: 'offline',
  sending: false,
  cache: new Map(), // conversation_id -> { lastId, events, agentState, answered: Set<cause> }
  typing: new Map(), // cause -> typing bubble of the open conversation
  pending: null, // { convId, content, client_event_id } of the last unacknowledged message
};

/* ---------- small helpers ---------- */

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'className') node.className = value;
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c != null)); // strings become text nodes
  return node;
}

function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

function claimsOf(token) {
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const bytes = Uint8Array.from(atob(part), (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return null;
  }
}

function cacheFor(id) {
  if (!state.cache.has(id)) {
    state.cache.set(id, { lastId: -1, events: [], agentState: undefined, answered: new Set() });
  }
  return state.cache.get(id);
}

async function api(method, path, body, { auth = true } = {}) {
  const headers = { accept: 'application/json' };
  if (auth && state.token) headers.authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`/api${path}`, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = res.status === 204 ? null : await res.json().catch(() => null);
  if (!res.ok) {
    const err = new Error(data?.error?.message || `HTTP ${res.status}`);
    err.code = data?.error?.code || `HTTP_${res.status}`;
    if (res.status === 401) askForToken(`${err.code}: ${err.message}`);
    throw err;
  }
  return data;
}

const describe = (err) => (err.code ? `${err.code}: ${err.message}` : err.message);

/* ---------- token ---------- */

function askForToken(reason = '') {
  $('auth-reason').textContent = reason;
  const dialog = $('auth-dialog');
  if (!dialog.open) dialog.showModal();
}

function showIdentity() {
  const c = state.token ? claimsOf(state.token) : null;
  if (!c) {
    $('who').textContent = state.token ? 'Token (unreadable claims)' : 'No token';
    return;
  }
  const admin = Array.isArray(c.roles) && c.roles.includes('admin') ? ' · admin' : '';
  const expired = typeof c.exp === 'number' && c.exp * 1000 < Date.now() ? ' · expired' : '';
  $('who').textContent = `user ${c.sub ?? '?'} · tenant ${c.tid ?? '?'}${admin}${expired}`;
}

function setToken(token) {
  state.token = token;
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
  closeChat();
  state.cache.clear();
  state.pending = null;
  showIdentity();
  void loadConversations(true);
}

$('dev-token-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const f = e.currentTarget.elements;
  const body = {
    user_id: f.user_id.value.trim(),
    tenant_id: f.tenant_id.value.trim(),
    roles: f.admin.checked ? ['admin'] : [],
  };
  try {
    const { token } = await api('POST', '/dev/token', body, { auth: false });
    setToken(token);
    $('auth-dialog').close();
  } catch (err) {
    $('auth-reason').textContent = `Could not get a token — ${describe(err)}`;
  }
});

$('paste-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const token = e.currentTarget.elements.token.value.trim().replace(/^Bearer\s+/i, '');
  if (!token) return;
  e.currentTarget.reset();
  setToken(token);
  $('auth-dialog').close();
});

$('forget-btn').addEventListener('click', () => {
  setToken('');
  $('auth-reason').textContent = 'Token forgotten.';
});
$('auth-close').addEventListener('click', () => $('auth-dialog').close());
$('token-btn').addEventListener('click', () => askForToken());

/* ---------- conversation list ---------- */

function metaOf(c) {
  return [
    el('span', { className: 'pill', 'data-status': c.status ?? '' }, c.status ?? '?'),
    ` ${c.agent_state ?? 'no agent state'} · ${fmtTime(c.last_updated_at)}`,
  ];
}

function convItem(c) {
  const title = c.title || 'Untitled';
  const open = el(
    'button',
    { type: 'button', className: 'conv-open' },
    el('span', { className: 'conv-title' }, title),
    el('span', { className: 'conv-meta' }, ...metaOf(c)),
  );
  if (state.conv?.conversation_id === c.conversation_id) open.setAttribute('aria-current', 'true');
  open.addEventListener('click', () => selectConversation(li.info));

  const del = el(
    'button',
    { type: 'button', className: 'conv-del', 'aria-label': `Delete “${title}”` },
    '✕',
  );
  del.addEventListener('click', async () => {
    if (!globalThis.confirm(`Delete “${title}” and all its events?`)) return;
    try {
      await api('DELETE', `/conversations/${encodeURIComponent(c.conversation_id)}`);
      if (state.conv?.conversation_id === c.conversation_id) closeChat();
      state.cache.delete(c.conversation_id);
      li.remove();
      $('list-empty').hidden = $('conv-list').children.length > 0;
    } catch (err) {
      $('list-error').textContent = `Delete failed — ${describe(err)}`;
    }
  });

  const li = el('li', { 'data-id': c.conversation_id }, open, del);
  li.info = c;
  return li;
}

// Updates an item in place (keeps keyboard focus where it is).
function refreshListItem(id, patch) {
  const li = [...$('conv-list').children].find((node) => node.dataset.id === id);
  if (!li) return;
  li.info = { ...li.info, ...patch };
  li.querySelector('.conv-meta').replaceChildren(...metaOf(li.info));
}

async function loadConversations(reset) {
  $('list-error').textContent = '';
  const list = $('conv-list');
  if (!state.token) {
    list.replaceChildren();
    $('more-btn').hidden = true;
    return;
  }
  const qs = new URLSearchParams({ limit: '20' });
  if (!reset && state.nextPageId) qs.set('page_id', state.nextPageId);
  try {
    const data = await api('GET', `/conversations?${qs}`);
    if (reset) list.replaceChildren();
    list.append(...data.results.map(convItem));
    state.nextPageId = data.next_page_id || null;
    $('more-btn').hidden = !state.nextPageId;
    $('list-empty').hidden = list.children.length > 0;
  } catch (err) {
    $('list-error').textContent = `Could not load conversations — ${describe(err)}`;
  }
}

$('refresh-btn').addEventListener('click', () => loadConversations(true));
$('more-btn').addEventListener('click', () => loadConversations(false));

$('create-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const form = e.currentTarget;
  const title = form.elements.title.value.trim();
  const first = form.elements.initial_user_msg.value;
  const body = {};
  if (title) body.title = title;
  if (first.trim()) body.initial_user_msg = first;
  $('create-error').textContent = '';
  try {
    const res = await api('POST', '/conversations', body);
    form.reset();
    await loadConversations(true);
    selectConversation({
      conversation_id: res.conversation_id,
      title,
      status: res.conversation_status,
    });
  } catch (err) {
    $('create-error').textContent = `Could not create — ${describe(err)}`;
  }
});

/* ---------- chat pane ---------- */

function setConnection(kind) {
  state.connection = kind;
  const labels = {
    offline: 'offline',
    connecting: 'connecting…',
    connected: 'connected',
    reconnecting: 'reconnecting…',
  };
  $('conn').dataset.state = kind;
  $('conn-text').textContent = labels[kind];
  updateControls();
}

function updateControls() {
  const live = state.connection === 'connected';
  $('send-btn').disabled = !live || state.sending;
  for (const b of document.querySelectorAll('[data-agent-state]')) b.disabled = !live;
}

function setAgentState(s) {
  $('agent-state').textContent = s ?? '—';
  $('agent-state').dataset.state = s ?? '';
}

let bannerTimer;
function showBanner(type, text) {
  clearTimeout(bannerTimer);
  $('banner').dataset.type = type;
  $('banner-text').textContent = text;
  $('banner').hidden = false;
  if (type === 'info') bannerTimer = setTimeout(hideBanner, 5000);
}
function hideBanner() {
  $('banner').hidden = true;
}
$('banner-close').addEventListener('click', hideBanner);

function appendToLog(node) {
  const log = $('log');
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  log.append(node);
  if (atBottom) log.scrollTop = log.scrollHeight;
}

function systemLine(text) {
  return el('li', { className: 'sys' }, text);
}

function bubble(side, label, text, time) {
  return el(
    'li',
    { className: `msg ${side}` },
    el('span', { className: 'msg-head' }, label, time ? el('time', {}, ` ${fmtTime(time)}`) : null),
    el('p', { className: 'msg-body' }, text),
  );
}

function renderStored(ev, entry) {
  if (ev.observation === 'agent_state_changed') {
    const s = ev.extras?.agent_state;
    entry.agentState = s;
    setAgentState(s);
    const reason = ev.extras?.reason ? ` (${ev.extras.reason})` : '';
    appendToLog(systemLine(`Agent state → ${s}${reason}`));
  } else if (ev.action === 'message') {
    const mine = ev.source === 'user';
    if (!mine && ev.cause != null) {
      entry.answered.add(ev.cause);
      state.typing.get(ev.cause)?.remove();
      state.typing.delete(ev.cause);
    }
    appendToLog(
      bubble(
        mine ? 'user' : 'agent',
        mine ? 'You' : ev.source,
        ev.args?.content ?? '',
        ev.timestamp,
      ),
    );
  } else if (ev.action === 'change_agent_state') {
    appendToLog(systemLine(`${ev.source} asked for agent state “${ev.args?.agent_state}”`));
  } else if (ev.observation) {
    appendToLog(systemLine(`${ev.observation}${ev.content ? `: ${ev.content}` : ''}`));
  } else {
    appendToLog(systemLine(`${ev.source ?? 'event'}: ${ev.action ?? ev.message ?? 'unknown'}`));
  }
}

function appendDelta(entry, { cause, delta }) {
  if (entry.answered.has(cause)) return; // the stored message already arrived
  let node = state.typing.get(cause);
  if (!node) {
    // Screen readers get the stored message once it arrives, not every delta.
    node = bubble('agent typing', 'agent is typing…', '');
    node.setAttribute('aria-hidden', 'true');
    state.typing.set(cause, node);
    appendToLog(node);
  }
  node.querySelector('.msg-body').append(String(delta ?? ''));
}

function onEvent(entry, ev) {
  if (ev.status_update) {
    showBanner(ev.type === 'error' ? 'error' : 'info', `${ev.message || ev.id} [${ev.id}]`);
  } else if (ev.stream) {
    appendDelta(entry, ev);
  } else if (Number.isInteger(ev.id) && ev.id > entry.lastId) {
    entry.lastId = ev.id;
    entry.events.push(ev);
    renderStored(ev, entry);
    const patch = { last_updated_at: ev.timestamp };
    if (ev.observation === 'agent_state_changed') patch.agent_state = ev.extras?.agent_state;
    refreshListItem(entry.id, patch);
  } // stored events at or below the last rendered id are duplicates: ignored
}

function closeChat() {
  const socket = state.socket;
  state.socket = null; // handlers of the old socket check this and go quiet
  socket?.disconnect();
  state.conv = null;
  state.typing.clear();
  $('log').replaceChildren();
  $('chat-title').textContent = 'No conversation selected';
  $('chat-meta').textContent = '';
  $('send-error').textContent = '';
  setAgentState(null);
  hideBanner();
  setConnection('offline');
  for (const b of document.querySelectorAll('.conv-open[aria-current]'))
    b.removeAttribute('aria-current');
}

function selectConversation(c) {
  closeChat();
  const id = c.conversation_id;
  state.conv = c;
  for (const li of $('conv-list').children) {
    li.querySelector('.conv-open').toggleAttribute('aria-current', li.dataset.id === id);
  }
  $('chat-title').textContent = c.title || 'Untitled';
  const entry = cacheFor(id);
  entry.id = id;
  for (const ev of entry.events) renderStored(ev, entry); // what this page already has
  if (entry.agentState === undefined) setAgentState(c.agent_state);
  $('log').scrollTop = $('log').scrollHeight;
  connect(entry);
  api('GET', `/conversations/${encodeURIComponent(id)}`)
    .then((info) => {
      if (state.conv?.conversation_id !== id) return;
      $('chat-title').textContent = info.title || 'Untitled';
      $('chat-meta').textContent = `${info.status} · created ${fmtTime(info.created_at)} · ${id}`;
      if (entry.agentState === undefined) setAgentState(info.agent_state);
    })
    .catch((err) => showBanner('error', `Could not load the conversation — ${describe(err)}`));
}

function connect(entry) {
  if (typeof io !== 'function') {
    showBanner('error', 'The Socket.IO client (/socket.io/socket.io.js) did not load.');
    return;
  }
  const socket = io({
    transports: ['websocket'],
    forceNew: true, // one manager per conversation, so the query is never shared
    auth: { token: state.token },
    query: { conversation_id: entry.id, latest_event_id: String(entry.lastId) },
  });
  state.socket = socket;
  const current = () => state.socket === socket;
  setConnection('connecting');

  // Resume after the last rendered event on every reconnect attempt.
  socket.io.on('reconnect_attempt', () => {
    socket.io.opts.query.latest_event_id = String(entry.lastId);
    if (current()) setConnection('reconnecting');
  });
  socket.on('connect', () => {
    if (current()) setConnection('connected');
  });
  socket.on('disconnect', (reason) => {
    if (!current()) return;
    setConnection('reconnecting');
    if (reason === 'io server disconnect') {
      // The server closed this socket; Socket.IO does not retry by itself in that case.
      setTimeout(() => {
        if (!current()) return;
        socket.io.opts.query.latest_event_id = String(entry.lastId);
        socket.connect();
      }, 1000);
    }
  });
  socket.on('connect_error', (err) => {
    if (!current()) return;
    if (socket.active) {
      setConnection('reconnecting'); // transport problem: the manager keeps retrying
      return;
    }
    // Refused by the server (UNAUTHORIZED, NOT_FOUND, BAD_REQUEST): no automatic retry.
    const code = err.data?.code || err.message;
    setConnection('offline');
    showBanner('error', `Connection refused — ${code}: ${err.data?.message || err.message}`);
    if (code === 'UNAUTHORIZED') askForToken('The token was refused. Get or paste a new one.');
  });
  socket.on('oh_event', (ev) => {
    if (current()) onEvent(entry, ev);
  });
}

/* ---------- sending ---------- */

// Emits a user action; onAck always receives { ok, event_id } or { ok: false, error }.
function userAction(body, onAck = () => {}) {
  const socket = state.socket;
  $('send-error').textContent = '';
  const fail = (code, message) => {
    $('send-error').textContent = `${code}: ${message}`;
    onAck({ ok: false, error: { code, message } });
  };
  if (!socket?.connected) return fail('NOT_CONNECTED', 'wait for the connection, then retry');
  socket.timeout(ACK_TIMEOUT_MS).emit('oh_user_action', body, (timeoutErr, ack) => {
    if (timeoutErr) return fail('TIMEOUT', 'no acknowledgement; sending again is safe');
    if (!ack?.ok) return fail(ack?.error?.code ?? 'ERROR', ack?.error?.message ?? 'no details');
    onAck(ack);
  });
}

$('send-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const content = $('msg').value;
  if (!content.trim() || !state.conv || state.sending) return;
  const convId = state.conv.conversation_id;
  const p = state.pending;
  if (!p || p.convId !== convId || p.content !== content) {
    // A new text gets a new key; re-sending the same unacknowledged text reuses it.
    state.pending = { convId, content, client_event_id: crypto.randomUUID() };
  }
  const pending = state.pending;
  state.sending = true;
  updateControls();
  userAction(
    { action: 'message', args: { content }, client_event_id: pending.client_event_id },
    (ack) => {
      state.sending = false;
      updateControls();
      if (!ack.ok) return;
      if (state.pending === pending) state.pending = null;
      if ($('msg').value === content) $('msg').value = '';
    },
  );
});

$('msg').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('send-form').requestSubmit();
  }
});

for (const button of document.querySelectorAll('[data-agent-state]')) {
  button.addEventListener('click', () =>
    userAction({ action: 'change_agent_state', args: { agent_state: button.dataset.agentState } }),
  );
}

/* ---------- start ---------- */

showIdentity();
setConnection('offline');
if (state.token) void loadConversations(true);
else askForToken('Get a development token or paste one to start.');
