// VoxMux Studio: the few things the server cannot render. Theme, favourites and the last voices
// used live in localStorage; the API key never does (it is traded for an HttpOnly cookie).
"use strict";

(function () {
  const KEYS = { theme: "voxmux.theme", favs: "voxmux.favourites", recent: "voxmux.recent",
                 open: "voxmux.open", draft: "voxmux.draft", compare: "voxmux.compare" };
  const RECENT_LIMIT = 8;
  const $ = (id) => document.getElementById(id);

  function load(key, fallback) {
    try {
      const value = JSON.parse(localStorage.getItem(key));
      return value === null ? fallback : value;
    } catch (e) {
      return fallback;
    }
  }

  function save(key, value) {
    try { localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* private mode */ }
  }

  // -- favourites and recent voices -----------------------------------------------------------

  const Studio = {
    favourites: () => load(KEYS.favs, []),
    recent: () => load(KEYS.recent, []),
    compared: () => load(KEYS.compare, []),
  };
  window.Studio = Studio;

  function refresh() { htmx.trigger(document.body, "studio-refresh"); }

  function voicesChanged() { htmx.trigger(document.body, "voices-changed"); }

  function toggleFavourite(key) {
    const favs = Studio.favourites();
    const at = favs.indexOf(key);
    if (at >= 0) favs.splice(at, 1); else favs.push(key);
    save(KEYS.favs, favs);
    voicesChanged();
  }

  function rememberVoice(model, voice) {
    if (!model || !voice) return;
    const key = model + ":" + voice;
    const recent = [key, ...Studio.recent().filter((k) => k !== key)].slice(0, RECENT_LIMIT);
    save(KEYS.recent, recent);
    voicesChanged();
  }

  // -- the comparison: two to four voices, any models, kept here like the favourites ----------

  function toggleCompare(button) {
    const key = button.dataset.pick;
    const picks = Studio.compared();
    const at = picks.indexOf(key);
    const most = Number($("compare").dataset.max || 4);
    if (at >= 0) picks.splice(at, 1);
    else if (picks.length >= most) {
      const count = $("compare-count");
      if (count) count.textContent = `${most} voices at most: remove one (✕) before adding another.`;
      return;
    } else picks.push(key);
    save(KEYS.compare, picks);
    button.setAttribute("aria-pressed", String(at < 0));
    htmx.trigger(document.body, "compare-changed");
    voicesChanged();
  }

  // -- voice samples: one player for all; the server renders each sample once (audio cache) ---

  function previewStatus(text) { $("preview-status").textContent = text; }

  function markPlaying(button) {
    document.querySelectorAll('button[data-action="preview"][aria-pressed="true"]')
      .forEach((b) => b.setAttribute("aria-pressed", "false"));
    if (button) button.setAttribute("aria-pressed", "true");
  }

  function playSample(button) {
    const audio = $("preview-player");
    const { model, voice } = button.dataset;
    const url = "/studio/preview?" + new URLSearchParams({ model, voice });
    const same = audio.getAttribute("src") === url;
    if (same && !audio.paused) {  // a second press stops it
      audio.pause();
      markPlaying(null);
      previewStatus(`Stopped ${voice} (${model}).`);
      return;
    }
    $("preview-error").hidden = true;
    audio.dataset.label = `${voice} (${model})`;
    if (same) audio.currentTime = 0;  // the player still holds it: no request at all
    else audio.src = url;
    markPlaying(button);
    previewStatus(`Loading a sample of ${audio.dataset.label}…`);
    audio.play().catch(() => { /* an error event says why */ });
  }

  async function previewFailed() {
    const audio = $("preview-player");
    markPlaying(null);
    previewStatus("");
    let message = "The sample could not be played.";
    try {
      const response = await fetch(audio.getAttribute("src"), { credentials: "same-origin" });
      if (!response.ok) message = await errorMessage(response);
    } catch (e) { /* the server could not be reached: the message above */ }
    const error = $("preview-error");
    error.textContent = message;
    error.hidden = false;
    audio.removeAttribute("src");
  }

  function watchPreview() {
    const audio = $("preview-player");
    audio.addEventListener("playing", () => previewStatus(`Playing a sample of ${audio.dataset.label}.`));
    audio.addEventListener("ended", () => { markPlaying(null); previewStatus(`Played ${audio.dataset.label}.`); });
    audio.addEventListener("error", () => { if (audio.getAttribute("src")) previewFailed(); });
  }

  function defaultVoice(model) {
    const option = $("model").querySelector(`option[value="${CSS.escape(model)}"]`);
    return option ? option.dataset.defaultVoice : "";
  }

  function chosen() {
    const model = $("model").value;
    const voice = $("voice").value.trim();
    return { model, voice, resolved: voice || defaultVoice(model) };
  }

  function useVoice(model, voice) {
    $("model").value = model;
    $("voice").value = voice;
    updateVoicePlaceholder();
    document.querySelectorAll(".voice.selected").forEach((el) => el.classList.remove("selected"));
    document.querySelectorAll(`.voice[data-key="${CSS.escape(model + ":" + voice)}"]`)
      .forEach((el) => el.classList.add("selected"));
  }

  function updateVoicePlaceholder() {
    $("voice").placeholder = defaultVoice($("model").value);
  }

  // -- theme ----------------------------------------------------------------------------------

  function applyTheme(theme) {
    document.documentElement.dataset.theme = theme;
    const button = $("theme-toggle");
    button.textContent = theme === "dark" ? "Light theme" : "Dark theme";
    button.setAttribute("aria-pressed", String(theme === "dark"));
  }

  function toggleTheme() {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    try { localStorage.setItem(KEYS.theme, next); } catch (e) { /* private mode */ }
    applyTheme(next);
  }

  // -- text box -------------------------------------------------------------------------------

  function updateCounter() {
    const text = $("text");
    const used = [...text.value].length;  // code points, as the server counts them
    const limit = Number(text.dataset.limit);
    $("char-used").textContent = used.toLocaleString();
    $("char-count").classList.toggle("over", used > limit);
  }

  function updateSpeed() {
    $("speed-value").textContent = Number($("speed").value).toFixed(2) + "×";
  }

  // -- collapsible sections keep the state the person gave them across polling ----------------

  function applyOpenState(root) {
    const state = load(KEYS.open, {});
    root.querySelectorAll("details[data-remember]").forEach((el) => {
      const wanted = state[el.dataset.remember];
      if (typeof wanted === "boolean") el.open = wanted;
    });
  }

  function rememberToggle(summary) {
    const details = summary.parentElement;
    const state = load(KEYS.open, {});
    state[details.dataset.remember] = !details.open;  // the click is about to flip it
    save(KEYS.open, state);
  }

  // -- sign in: the key goes to the server once, then only the HttpOnly cookie remains -------

  async function signIn(form) {
    const input = $("api-key");
    const key = input.value;
    input.value = "";
    const error = $("auth-error");
    error.hidden = true;
    let response;
    try {
      response = await fetch("/v1/auth/session", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ key }),
        credentials: "same-origin",
      });
    } catch (e) {
      showAuthError("The server could not be reached.");
      return;
    }
    if (response.ok) {
      reloadKeepingDraft();
      return;
    }
    showAuthError(await errorMessage(response));
    input.focus();
  }

  function showAuthError(message) {
    const error = $("auth-error");
    error.textContent = message;
    error.hidden = false;
  }

  async function signOut() {
    await fetch("/v1/auth/session", { method: "DELETE", credentials: "same-origin" });
    reloadKeepingDraft();
  }

  function reloadKeepingDraft() {
    try { sessionStorage.setItem(KEYS.draft, $("text").value); } catch (e) { /* ignore */ }
    location.reload();
  }

  async function errorMessage(response) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return `The server answered ${response.status} ${response.statusText}.`;
  }

  // -- streaming player: int16 PCM frames from /ws/v1/tts scheduled on Web Audio as they come --

  const player = { ctx: null, ws: null, sources: [], next: 0, session: 0 };

  function streamState(text) { $("stream-state").textContent = text; }

  function streamError(message) {
    const el = $("stream-error");
    el.textContent = message;
    el.hidden = !message;
  }

  function setStreaming(active) {
    $("stream").disabled = active;
    $("stop").disabled = !active;
  }

  function stopAudio() {
    player.sources.forEach((source) => { try { source.stop(); } catch (e) { /* not started */ } });
    player.sources = [];
    player.next = 0;
  }

  function stopStream() {
    if (player.ws && player.ws.readyState === WebSocket.OPEN) {
      player.ws.send(JSON.stringify({ type: "cancel" }));
    }
    stopAudio();
    setStreaming(false);
    streamState("stopped");
  }

  async function startStream() {
    const { model, voice, resolved } = chosen();
    if (player.ws && player.ws.readyState <= WebSocket.OPEN) player.ws.close(1000, "replaced");
    stopAudio();
    streamError("");
    $("ttfa").textContent = "–";
    delete $("ttfa").dataset.ms;
    $("stream-detail").textContent = "";
    rememberVoice(model, resolved);

    const ctx = player.ctx || (player.ctx = new AudioContext());
    if (ctx.state !== "running") await ctx.resume();
    const session = ++player.session;
    const started = performance.now();
    const request = { model, input: $("text").value, speed: Number($("speed").value),
                      format: "pcm_s16le" };
    const untimed = player.untimed;  // a retry for a voice without word timings
    if (!untimed) request.timestamps = "word";
    player.untimed = false;
    const words = $("stream-words");
    words.textContent = "";
    words.hidden = true;
    player.words = [];
    player.chunks = [];
    if (voice) request.voice = voice;

    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/v1/tts`);
    ws.binaryType = "arraybuffer";
    player.ws = ws;
    setStreaming(true);
    streamState("connecting…");

    let rate = 0;
    let samples = 0;
    let segments = 0;
    let total = 0;
    let finished = false;
    let leftover = null;

    ws.onopen = () => ws.send(JSON.stringify(request));
    ws.onmessage = (event) => {
      if (session !== player.session) return;
      if (typeof event.data !== "string") {
        let bytes = new Uint8Array(event.data);
        if (leftover) {
          const joined = new Uint8Array(leftover.length + bytes.length);
          joined.set(leftover);
          joined.set(bytes, leftover.length);
          bytes = joined;
          leftover = null;
        }
        if (bytes.length % 2) {
          leftover = bytes.slice(-1);
          bytes = bytes.slice(0, -1);
        }
        if (!rate || !bytes.length) return;
        const pcm = new Int16Array(bytes.buffer, bytes.byteOffset, bytes.length / 2);
        player.chunks.push({ from: samples / rate, at: schedule(ctx, pcm, rate, started) });
        samples += pcm.length;
        return;
      }
      const message = JSON.parse(event.data);
      if (message.type === "started") {
        rate = message.sample_rate;
        total = message.segments || 0;
        streamState(`playing ${message.model} / ${message.voice}`);
      } else if (message.type === "words") {
        addStreamWords(message.words, request.input);
      } else if (message.type === "segment") {
        segments += 1;
        $("stream-detail").textContent =
          `segment ${segments} of ${total || "?"} · ${(samples / rate).toFixed(1)} s received`;
      } else if (message.type === "done") {
        finished = true;
        const last = player.words.length ? player.words[player.words.length - 1].char_end : 0;
        if (last) $("stream-words").append(request.input.slice(last));
        const s = message.stats || {};
        const parts = [`${s.segments} segments`, `${(s.audio_duration_ms / 1000).toFixed(2)} s of audio`];
        if (s.ttfb_ms != null) parts.push(`server first audio ${Math.round(s.ttfb_ms)} ms`);
        if (s.rtf != null) parts.push(`RTF ${s.rtf.toFixed(3)}`);
        if (untimed) parts.push("no word timings for this voice");
        $("stream-detail").textContent = parts.join(" · ");
        streamState("received; playing to the end");
        refresh();
        finishWhenPlayed(ctx, session);
      } else if (message.type === "error" && message.error &&
                 message.error.code === "timestamps_unsupported") {
        finished = true;  // an engine or voice without word timings: stream without them
        ws.close(1000, "retry");
        player.untimed = true;
        startStream();
      } else if (message.type === "error") {
        finished = true;
        stopAudio();
        setStreaming(false);
        streamState("failed");
        streamError(message.error ? message.error.message : "The stream failed.");
      } else if (message.type === "cancelled") {
        finished = true;
        setStreaming(false);
        streamState("cancelled");
      }
    };
    ws.onclose = (event) => {
      if (session !== player.session || finished) return;
      setStreaming(false);
      stopAudio();
      streamState("closed");
      if (event.code === 1008 && event.reason === "invalid_api_key") {
        streamError("Sign in with an API key to stream speech.");
      } else if (event.code !== 1000) {
        streamError(`The stream closed early (code ${event.code}${event.reason ? ": " + event.reason : ""}).`);
      }
    };
  }

  function schedule(ctx, pcm, rate, started) {
    const buffer = ctx.createBuffer(1, pcm.length, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(ctx.destination);
    // A small lead keeps chunks gapless when the next one arrives a little late.
    const at = Math.max(player.next, ctx.currentTime + 0.05);
    source.start(at);
    source.onended = () => { player.sources = player.sources.filter((s) => s !== source); };
    player.sources.push(source);
    if (!$("ttfa").dataset.ms) {
      const ms = performance.now() - started + (at - ctx.currentTime) * 1000;
      $("ttfa").textContent = `${Math.round(ms)} ms`;
      $("ttfa").dataset.ms = String(Math.round(ms));
    }
    player.next = at + buffer.duration;
    if (!player.raf) player.raf = requestAnimationFrame(highlightStream);
    return at;
  }

  // -- word highlighting: the clip player's time, or the stream's response time ----------------

  function highlight(container, seconds) {
    if (!container) return;
    for (const span of container.querySelectorAll(".w")) {
      const on = Number(span.dataset.start) <= seconds && seconds < Number(span.dataset.end);
      span.classList.toggle("speaking", on);
    }
  }

  function addStreamWords(words, text) {
    const box = $("stream-words");
    const known = player.words.length;
    let position = known ? player.words[known - 1].char_end : 0;
    for (const w of words) {
      if (w.char_start > position) box.append(text.slice(position, w.char_start));
      const span = document.createElement("span");
      span.className = "w";
      span.dataset.start = String(w.start);
      span.dataset.end = String(w.end);
      span.textContent = text.slice(w.char_start, w.char_end);
      box.append(span);
      position = w.char_end;
      player.words.push(w);
    }
    box.hidden = false;
  }

  function streamTime(ctx) {
    // The response's time now: from the chunk playing, as each was scheduled where it fitted.
    let found = null;
    for (const chunk of player.chunks) {
      if (chunk.at <= ctx.currentTime) found = chunk; else break;
    }
    return found ? found.from + (ctx.currentTime - found.at) : -1;
  }

  function highlightStream() {
    player.raf = 0;
    if (!player.ctx || !player.chunks || !player.chunks.length) return;
    highlight($("stream-words"), streamTime(player.ctx));
    if (player.sources.length) player.raf = requestAnimationFrame(highlightStream);
  }

  function followClip() {
    const audio = $("player");
    const box = $("transcript");
    if (!audio || !box) return;
    const tick = () => {
      highlight(box, audio.currentTime);
      if (!audio.paused && !audio.ended) requestAnimationFrame(tick);
    };
    audio.addEventListener("play", () => requestAnimationFrame(tick));
    audio.addEventListener("seeked", tick);
    audio.addEventListener("ended", () => highlight(box, -1));
  }

  function finishWhenPlayed(ctx, session) {
    const left = Math.max(0, player.next - ctx.currentTime);
    setTimeout(() => {
      if (session !== player.session) return;
      setStreaming(false);
      streamState("done");
    }, left * 1000 + 50);
  }

  // -- wiring ---------------------------------------------------------------------------------

  document.addEventListener("click", (event) => {
    const summary = event.target.closest("details[data-remember] > summary");
    if (summary) rememberToggle(summary);
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const { action, model, voice, key } = button.dataset;
    if (action === "favourite") toggleFavourite(key);
    else if (action === "use") useVoice(model, voice);
    else if (action === "preview") playSample(button);
    else if (action === "compare") toggleCompare(button);
    else if (action === "sign-out") signOut();
  });

  document.addEventListener("submit", (event) => {
    if (event.target.id === "sign-in") {
      event.preventDefault();
      signIn(event.target);
    }
  });

  // The voice list shows favourites and recent voices first, and the comparison its voices:
  // they live here, not on the server.
  document.addEventListener("htmx:configRequest", (event) => {
    const id = event.detail.elt.id;
    if (id === "voice-filters") {
      event.detail.parameters.fav = Studio.favourites().join(",");
      event.detail.parameters.recent = Studio.recent().join(",");
    }
    if (id === "voice-filters" || id === "compare") {
      event.detail.parameters.cmp = Studio.compared().join(",");
    }
  });

  document.addEventListener("htmx:beforeRequest", (event) => {
    if (event.detail.elt.id === "compose") {
      const { model, resolved } = chosen();
      rememberVoice(model, resolved);
    }
  });

  function errorFragment(message) {
    const p = document.createElement("p");
    p.className = "error";
    p.setAttribute("role", "alert");
    p.textContent = message;
    return p.outerHTML;
  }

  // Fragments come as HTML; anything else (a JSON API error, a proxy's page) becomes its words.
  document.addEventListener("htmx:beforeSwap", (event) => {
    const xhr = event.detail.xhr;
    const type = xhr.getResponseHeader("content-type") || "";
    if (type.startsWith("text/html")) return;
    let message = `The server answered ${xhr.status} ${xhr.statusText}.`;
    try { message = JSON.parse(xhr.responseText).error.message || message; } catch (e) { /* */ }
    event.detail.serverResponse = errorFragment(message);
  });

  document.addEventListener("htmx:sendError", (event) => {
    const target = { compose: "result", "compare-form": "comparison" }[event.detail.elt.id];
    if (target) {
      $(target).innerHTML = errorFragment("The server could not be reached; is it running?");
    }
  });

  document.addEventListener("htmx:afterSwap", (event) => {
    applyOpenState(event.detail.target);
    if (event.detail.target.id === "comparison") refresh();
    if (event.detail.target.id === "result") {
      refresh();
      followClip();
      const audio = $("player");
      if (audio) audio.play().catch(() => { /* the person presses play */ });
    }
  });

  document.addEventListener("DOMContentLoaded", () => {
    applyTheme(document.documentElement.dataset.theme || "light");
    $("theme-toggle").addEventListener("click", toggleTheme);
    const text = $("text");
    try {
      const draft = sessionStorage.getItem(KEYS.draft);
      if (draft !== null) { text.value = draft; sessionStorage.removeItem(KEYS.draft); }
    } catch (e) { /* ignore */ }
    text.addEventListener("input", updateCounter);
    text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("compose").requestSubmit();
    });
    $("speed").addEventListener("input", updateSpeed);
    $("model").addEventListener("change", updateVoicePlaceholder);
    $("stream").addEventListener("click", startStream);
    $("stop").addEventListener("click", stopStream);
    updateCounter();
    updateSpeed();
    updateVoicePlaceholder();
    watchPreview();
    applyOpenState(document);
    if (Studio.favourites().length || Studio.recent().length || Studio.compared().length) {
      voicesChanged();
    }
    if (Studio.compared().length) htmx.trigger(document.body, "compare-changed");
  });
})();
