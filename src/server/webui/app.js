// The inferd chat page: talks to this server's OpenAI API (/v1/chat/completions,
// streamed as server-sent events), renders answers as sanitized Markdown, and
// keeps the conversation, settings and API key in localStorage.
//
// Model output is untrusted: it reaches the page only as text (textContent) or
// as Markdown turned into HTML by marked and then cleaned by DOMPurify, inserted
// as a DOM fragment. The server's Content-Security-Policy forbids inline
// scripts and foreign requests besides.
'use strict';

const STORE = {chat: 'inferd.chat', settings: 'inferd.settings', key: 'inferd.apiKey'};
const SAMPLING_FIELDS = [  // form input id -> request field
  ['temperature', 'temperature', Number], ['top-p', 'top_p', Number], ['top-k', 'top_k', Number],
  ['max-tokens', 'max_tokens', Number], ['seed', 'seed', Number],
];
const RENDER_INTERVAL_MS = 50;  // re-render a streaming answer at most this often

const $ = (id) => document.getElementById(id);
const ui = {
  model: $('model-name'), messages: $('messages'), conversation: $('conversation'), empty: $('empty-hint'),
  composer: $('composer'), input: $('message'), send: $('send'), stop: $('stop'), status: $('status'),
  newChat: $('new-chat'), openSettings: $('open-settings'), settings: $('settings'),
  system: $('system-prompt'), ignoreEos: $('ignore-eos'),
  keyState: $('key-state'), forgetKey: $('forget-key'),
  keyDialog: $('key-dialog'), keyInput: $('api-key'), keyReason: $('key-reason'),
};

// ---- stored state ---------------------------------------------------------

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}
function save(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch {
    // Storage full or disabled: the page still works, it just forgets on reload.
  }
}

// Each message: {role: 'user'|'assistant', content, reasoning?, stats?, state?, error?, excluded?}.
// `excluded` turns (a failed request and its question) are shown but not sent again.
let chat = load(STORE.chat, {messages: []});
if (!Array.isArray(chat.messages)) chat = {messages: []};
for (const m of chat.messages) {  // the page was closed while this answer streamed
  if (m.state === 'streaming') m.state = 'stopped';
}
let settings = load(STORE.settings, {});
let apiKey = localStorage.getItem(STORE.key) || '';

// ---- API calls ------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch {
    // not JSON
  }
  return `${response.status} ${response.statusText}`;
}

// fetch() with the API key; on 401 asks the user for a key and tries again.
// Rejects with ApiError for other failures, or when the user cancels the prompt.
async function apiFetch(path, init = {}) {
  for (;;) {
    const headers = new Headers(init.headers || {});
    if (apiKey) headers.set('Authorization', `Bearer ${apiKey}`);
    const response = await fetch(path, {...init, headers});
    if (response.status !== 401) return response;
    const message = await errorMessage(response);
    const key = await askForKey(apiKey ? `The server refused the key: ${message}` : 'This server asks for an API key.');
    if (key === null) throw new ApiError(401, 'No API key given.');
    apiKey = key;
    localStorage.setItem(STORE.key, apiKey);
    updateKeyState();
  }
}

// Opens the key dialog; resolves to the key entered, or null if cancelled.
// Concurrent callers share one dialog.
let pendingKey = null;
function askForKey(reason) {
  if (pendingKey) return pendingKey;
  ui.keyReason.textContent = reason;
  ui.keyInput.value = '';
  pendingKey = new Promise((resolve) => {
    ui.keyDialog.addEventListener('close', () => {
      pendingKey = null;
      const key = ui.keyDialog.returnValue === 'save' ? ui.keyInput.value.trim() : '';
      ui.keyInput.value = '';
      resolve(key || null);
    }, {once: true});
  });
  ui.keyDialog.returnValue = '';
  ui.keyDialog.showModal();
  ui.keyInput.focus();
  return pendingKey;
}

// The server-sent events of a streaming response, as the text of each `data:` field.
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart());
      if (data.length) yield data.join('\n');
    }
  }
}

async function showModel() {
  for (;;) {
    try {
      const response = await apiFetch('/v1/models');
      if (response.status === 503) {  // the model is still loading
        ui.model.textContent = 'model loading…';
        await new Promise((r) => setTimeout(r, 1000));
        continue;
      }
      if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
      const model = (await response.json()).data[0];
      ui.model.textContent = model.id;
      ui.model.title = `Model ${model.id}, context ${model.max_model_len} tokens`;
    } catch (e) {
      ui.model.textContent = 'model unknown';
      if (e instanceof ApiError) setStatus(e.message);
    }
    return;
  }
}

// ---- rendering ------------------------------------------------------------

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) {  // links leave the page, and tell it nothing
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
});

function markdown(text) {
  const html = marked.parse(text, {gfm: true, breaks: false, async: false});
  return DOMPurify.sanitize(html, {RETURN_DOM_FRAGMENT: true, FORBID_TAGS: ['style', 'form', 'input', 'button']});
}

// The clipboard API exists only in secure contexts (https, localhost); a page
// opened at http://<LAN address> copies through a selection instead.
async function copyText(pre) {
  const text = pre.querySelector('code')?.textContent ?? pre.textContent;
  if (navigator.clipboard) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // denied: try the selection
    }
  }
  const range = document.createRange();
  range.selectNodeContents(pre);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
  const copied = document.execCommand('copy');
  selection.removeAllRanges();
  return copied;
}

function addCopyButtons(container) {
  for (const pre of container.querySelectorAll('pre')) {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'copy-code';
    button.textContent = 'Copy';
    button.setAttribute('aria-label', 'Copy code');
    button.addEventListener('click', async () => {
      button.textContent = (await copyText(pre)) ? 'Copied' : 'Copy failed';
      setTimeout(() => { button.textContent = 'Copy'; }, 1500);
    });
    // A bar above the code names its language (from marked's class) and holds the button.
    const language = document.createElement('span');
    language.className = 'code-language';
    const languageClass = [...(pre.querySelector('code')?.classList ?? [])].find((c) => c.startsWith('language-'));
    language.textContent = languageClass ? languageClass.slice('language-'.length) : 'code';
    const bar = document.createElement('div');
    bar.className = 'code-bar';
    bar.append(language, button);
    const wrap = document.createElement('div');
    wrap.className = 'code-block';
    pre.replaceWith(wrap);
    wrap.append(bar, pre);
  }
}

function formatStats(stats) {
  if (!stats) return '';
  const parts = [];
  if (stats.ttftMs != null) parts.push(`first token ${(stats.ttftMs / 1000).toFixed(2)} s`);
  if (stats.tokensPerSecond != null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tokens/s`);
  if (stats.tokens != null) parts.push(`${stats.estimated ? '~' : ''}${stats.tokens} tokens`);
  if (stats.finishReason === 'length') parts.push('cut at max tokens');
  if (stats.finishReason === 'abort') parts.push('ended by the server');
  return parts.join(' · ');
}

// The DOM of one message, made or updated in place.
function renderMessage(message, element) {
  const isUser = message.role === 'user';
  if (!element) {
    element = document.createElement('article');
    element.className = `message ${message.role}`;
    const heading = document.createElement('h2');
    heading.className = 'message-role';
    heading.textContent = isUser ? 'You' : 'Assistant';
    const body = document.createElement('div');
    body.className = 'message-body';
    const meta = document.createElement('p');
    meta.className = 'message-meta';
    element.append(heading, body, meta);
  }
  element.dataset.state = message.state || 'done';
  element.setAttribute('aria-busy', message.state === 'streaming' ? 'true' : 'false');
  const body = element.querySelector('.message-body');
  if (isUser) {
    body.textContent = message.content;
  } else {
    const parts = [];
    if (message.reasoning) {
      const details = document.createElement('details');
      details.className = 'reasoning';
      const summary = document.createElement('summary');
      summary.textContent = 'Thinking';
      const thought = document.createElement('div');
      thought.className = 'reasoning-text';
      thought.textContent = message.reasoning;
      details.append(summary, thought);
      const previous = body.querySelector('details.reasoning');
      if (previous) details.open = previous.open;
      parts.push(details);
    }
    const answer = document.createElement('div');
    answer.className = 'answer';
    answer.append(markdown(message.content || ''));
    addCopyButtons(answer);
    parts.push(answer);
    if (message.error) {
      const error = document.createElement('p');
      error.className = 'error';
      error.setAttribute('role', 'alert');
      error.textContent = message.error;
      parts.push(error);
    }
    body.replaceChildren(...parts);
  }
  const meta = element.querySelector('.message-meta');
  let metaText = formatStats(message.stats);
  if (message.state === 'stopped') metaText = metaText ? `stopped · ${metaText}` : 'stopped';
  meta.textContent = metaText;
  meta.hidden = !metaText;
  return element;
}

const elements = new WeakMap();  // message -> its <article>

function renderAll() {
  ui.messages.replaceChildren(ui.empty);
  ui.empty.hidden = chat.messages.length > 0;
  for (const message of chat.messages) {
    const element = renderMessage(message);
    elements.set(message, element);
    ui.messages.append(element);
  }
  scrollToEnd(true);
}

function appendMessage(message) {
  chat.messages.push(message);
  ui.empty.hidden = true;
  const element = renderMessage(message);
  elements.set(message, element);
  ui.messages.append(element);
  scrollToEnd(true);
}

function isNearEnd() {
  const c = ui.conversation;
  return c.scrollHeight - c.scrollTop - c.clientHeight < 80;
}
function scrollToEnd(force) {
  if (force || isNearEnd()) ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

function setStatus(text) {
  ui.status.textContent = text;
}

// ---- sending --------------------------------------------------------------

let generation = null;  // {controller} while an answer streams

function requestBody() {
  const messages = [];
  if (settings.system) messages.push({role: 'system', content: settings.system});
  for (const m of chat.messages) {
    if (m.excluded) continue;
    messages.push({role: m.role, content: m.content});
  }
  const body = {messages, stream: true, stream_options: {include_usage: true}};
  for (const [, field] of SAMPLING_FIELDS) {
    if (settings[field] != null && settings[field] !== '') body[field] = settings[field];
  }
  if (settings.ignore_eos) body.ignore_eos = true;
  return body;
}

function setGenerating(on) {
  // Focus on Stop (or Send) would fall to the page's body when it hides: it goes to the message box.
  const hadFocus = [ui.stop, ui.send, document.body].includes(document.activeElement);
  ui.send.disabled = on;
  ui.stop.hidden = !on;
  ui.newChat.disabled = on;
  if (!on && hadFocus) ui.input.focus();
}

async function send(text) {
  if (generation) return;
  appendMessage({role: 'user', content: text});
  const answer = {role: 'assistant', content: '', state: 'streaming'};
  const body = requestBody();
  appendMessage(answer);
  save(STORE.chat, chat);
  const element = elements.get(answer);
  const controller = new AbortController();
  generation = {controller};
  setGenerating(true);
  setStatus('Generating…');

  const started = performance.now();
  let firstTokenAt = null;
  let chunksWithText = 0;
  let usage = null;
  let finishReason = null;
  let renderTimer = null;
  const render = () => {
    renderTimer = null;
    const stick = isNearEnd();
    renderMessage(answer, element);
    if (stick) scrollToEnd(true);
  };
  const scheduleRender = () => {
    if (!renderTimer) renderTimer = setTimeout(render, RENDER_INTERVAL_MS);
  };

  try {
    const response = await apiFetch('/v1/chat/completions', {
      method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    for await (const data of serverSentEvents(response)) {
      if (data === '[DONE]') break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(500, chunk.error.message || 'the server reported an error');
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        const piece = (delta.content || '') + (delta.reasoning_content || '');
        if (piece) {
          if (firstTokenAt === null) firstTokenAt = performance.now();
          chunksWithText += 1;
          answer.content += delta.content || '';
          if (delta.reasoning_content) answer.reasoning = (answer.reasoning || '') + delta.reasoning_content;
          scheduleRender();
        }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
    }
    answer.state = 'done';
    setStatus('');
  } catch (e) {
    if (e.name === 'AbortError') {
      answer.state = 'stopped';
      setStatus('Stopped.');
    } else {
      answer.state = 'error';
      answer.error = e instanceof ApiError ? e.message : `The request failed: ${e.message}`;
      setStatus('The request failed.');
    }
  } finally {
    clearTimeout(renderTimer);
    if (!answer.content) {
      // A question with no answer is not sent again: the next request would
      // hold two user turns in a row, which some chat templates refuse.
      answer.excluded = true;
      chat.messages[chat.messages.length - 2].excluded = true;
    }
    const ended = performance.now();
    const tokens = usage ? usage.completion_tokens : chunksWithText;
    answer.stats = {
      ttftMs: firstTokenAt === null ? null : firstTokenAt - started,
      // Decode speed: the tokens after the first, over the time after the first.
      tokensPerSecond: firstTokenAt !== null && tokens > 1 && ended > firstTokenAt
        ? (tokens - 1) / ((ended - firstTokenAt) / 1000) : null,
      tokens: firstTokenAt === null ? null : tokens,
      estimated: !usage,
      finishReason,
    };
    renderMessage(answer, element);
    generation = null;
    setGenerating(false);
    save(STORE.chat, chat);
    scrollToEnd(false);
  }
}

function stopGeneration() {
  // Aborting the fetch closes its connection; the server sees the client go
  // and aborts the request in the engine, freeing its KV cache.
  if (generation) generation.controller.abort();
}

// ---- settings -------------------------------------------------------------

function updateKeyState() {
  ui.keyState.textContent = apiKey ? 'A key is stored in this browser.' : 'No key stored.';
  ui.forgetKey.disabled = !apiKey;
}

function fillSettingsForm() {
  ui.system.value = settings.system || '';
  for (const [id, field] of SAMPLING_FIELDS) $(id).value = settings[field] ?? '';
  ui.ignoreEos.checked = Boolean(settings.ignore_eos);
  updateKeyState();
}

function readSettingsForm() {
  const next = {system: ui.system.value.trim()};
  for (const [id, field, parse] of SAMPLING_FIELDS) {
    const raw = $(id).value.trim();
    if (raw !== '') next[field] = parse(raw);
  }
  if (ui.ignoreEos.checked) next.ignore_eos = true;
  return next;
}

// ---- wiring ---------------------------------------------------------------

ui.composer.addEventListener('submit', (event) => {
  event.preventDefault();
  const text = ui.input.value.trim();
  if (!text || generation) return;
  ui.input.value = '';
  fitMessageBox();
  send(text);
});

// The message box grows with its text (up to the CSS max-height), then scrolls.
function fitMessageBox() {
  ui.input.style.height = 'auto';
  ui.input.style.height = `${ui.input.scrollHeight + 2}px`;
}
ui.input.addEventListener('input', fitMessageBox);

ui.input.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  } else if (event.key === 'Escape' && generation) {
    event.preventDefault();
    stopGeneration();
  }
});

ui.stop.addEventListener('click', stopGeneration);

ui.newChat.addEventListener('click', () => {
  if (generation) return;
  chat = {messages: []};
  save(STORE.chat, chat);
  renderAll();
  setStatus('New chat.');
  ui.input.focus();
});

ui.openSettings.addEventListener('click', () => {
  fillSettingsForm();
  ui.settings.returnValue = '';
  ui.settings.showModal();
});

ui.settings.addEventListener('close', () => {
  if (ui.settings.returnValue === 'save') {
    settings = readSettingsForm();
    save(STORE.settings, settings);
    setStatus('Settings saved.');
  }
  ui.openSettings.focus();
});

// Cancel buttons are not submit buttons: Enter in a field submits with the
// form's first submit button, which must be the one that saves.
for (const button of document.querySelectorAll('[data-close-dialog]')) {
  button.addEventListener('click', () => button.closest('dialog').close('cancel'));
}

ui.forgetKey.addEventListener('click', () => {
  apiKey = '';
  localStorage.removeItem(STORE.key);
  updateKeyState();
});

renderAll();
updateKeyState();
showModel();
// Not on touch screens: focus there opens the on-screen keyboard over the page.
if (window.matchMedia('(pointer: fine)').matches) ui.input.focus();
