// Parley demo page: one call at a time over WebRTC, in OpenAI Realtime's browser flow.
//
//   1. POST /v1/realtime/client_secrets  (JSON session settings)  -> an ephemeral secret
//   2. offer SDP (microphone, optional camera, data channel "oai-events"), ICE gathered
//   3. POST /v1/realtime/calls  (Bearer secret, application/sdp)   -> 201, answer SDP,
//      Location: .../calls/{call_id}
//   4. server events arrive as JSON on the data channel; settings changes go back as
//      session.update; POST .../calls/{call_id}/hangup ends the call.
//   5. when the media connection fails (ICE "failed", or "disconnected" for
//      DISCONNECTED_GRACE_MS), a new peer connection (same microphone and camera) offers
//      again with X-Parley-Session-Id / X-Parley-Resume-Token / X-Parley-Last-Event-Id:
//      the server joins it to the same session (history and settings kept) and replays
//      the events missed. window.parleyDemo.dropConnection() breaks the connection on
//      purpose (what a network change does), to try it out or test it.
//
// Elements tests read: #connect #hangup #status #transcript (.user / .assistant lines)
// #remote-level (data-level, data-max-level) #error (data-code) #latency (li[data-ms]).

const $ = (id) => document.getElementById(id);

const DEFAULTS = Object.freeze({
  instructions: "You are a helpful voice assistant. Answer briefly, in the language the user speaks.",
  threshold: 0.5,
  prefix_padding_ms: 300,
  silence_duration_ms: 500,
  video_fps_idle: 1,
  video_fps_speaking: 2,
  num_frames: 4,
  max_frames: 50,
});
const SETTINGS_KEY = "parley.demo.settings";
const API_KEY_KEY = "parley.demo.apiKey";

const METER_INTERVAL_MS = 20; // how often both level meters are read
const LOCAL_SPEECH_LEVEL = 0.015; // microphone RMS that counts as "still talking"
const REMOTE_AUDIO_LEVEL = 0.01; // received RMS that counts as "the answer is audible"
const ASSISTANT_HOLD_MS = 250; // the assistant indicator stays on this long after sound
const ICE_WAIT_MS = 2000;
const HANGUP_WAIT_MS = 3000;
const DISCONNECTED_GRACE_MS = 3000; // "disconnected" this long: re-attach rather than wait
const MAX_LOGGED_EVENTS = 200;

// --- small helpers -------------------------------------------------------------------------

class ReadableError extends Error {
  /** An error whose message is meant for the person at the page. */
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

function showError(code, message) {
  const box = $("error");
  box.textContent = message;
  box.dataset.code = code;
  box.hidden = false;
}

function clearError() {
  const box = $("error");
  box.textContent = "";
  delete box.dataset.code;
  box.hidden = true;
}

function setStatus(state, text) {
  const el = $("status");
  el.dataset.state = state;
  el.textContent = text;
}

function logEvent(direction, event) {
  const list = $("events");
  const item = document.createElement("li");
  item.className = direction;
  const time = new Date().toLocaleTimeString([], { hour12: false });
  const body = JSON.stringify(event);
  item.textContent = `${time} ${direction === "out" ? "→" : "←"} ${body.length > 240 ? body.slice(0, 240) + "…" : body}`;
  list.append(item);
  while (list.childElementCount > MAX_LOGGED_EVENTS) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

/** A line of the page's own in the event log (not an event). */
function logNote(text) {
  const list = $("events");
  const item = document.createElement("li");
  item.className = "note";
  item.textContent = `${new Date().toLocaleTimeString([], { hour12: false })} · ${text}`;
  list.append(item);
  while (list.childElementCount > MAX_LOGGED_EVENTS) list.firstElementChild.remove();
  list.scrollTop = list.scrollHeight;
}

function delay(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Resolves when ICE gathering completes, or after `ms` with what was gathered so far. */
function iceGathered(pc, ms) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === "complete") done();
    };
    const timer = setTimeout(done, ms);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

/** The server's explanation from an error response: `{error: {code, message}}` or text. */
async function errorDetail(response) {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    const err = body.error ?? body;
    return { code: err.code ?? "", message: err.message ?? err.detail ?? text };
  } catch {
    // Not JSON: a proxy's or a plain server's page. Quote it only when it is short text.
    const plain = text.trim();
    const usable = plain && !plain.startsWith("<") && plain.length <= 300;
    return { code: "", message: usable ? plain : response.statusText };
  }
}

async function post(url, options, what) {
  try {
    return await fetch(url, { method: "POST", ...options });
  } catch (exc) {
    if (exc.name === "AbortError") throw exc;
    throw new ReadableError(
      "unreachable",
      `Cannot reach the Parley server at ${location.origin} (${what}). ` +
        "Check that `parley serve` is running and reachable from this browser.",
    );
  }
}

async function httpError(response, what) {
  const { code, message } = await errorDetail(response);
  const said = message ? `: ${message}` : "";
  if (code === "session_limit" || (response.status === 503 && what === "starting the call")) {
    return new ReadableError(
      "session_limit",
      message
        ? `The server is at its session limit: ${message}`
        : "The server is at its session limit. Try again when another call has ended.",
    );
  }
  if (response.status === 401) {
    return what === "starting the call"
      ? new ReadableError("unauthorized", `The server refused the session secret (401)${said}.`)
      : new ReadableError(
          "unauthorized",
          `The server refused this page's credentials (401)${said}. ` +
            "If the server was started with an API key, enter it under Settings → Connection.",
        );
  }
  if (response.status === 503) {
    return new ReadableError("unavailable", `The server is not ready (503)${said}.`);
  }
  return new ReadableError(
    code || "http_error",
    `${what[0].toUpperCase()}${what.slice(1)} failed: HTTP ${response.status}${said}`,
  );
}

function mediaError(exc, device) {
  switch (exc.name) {
    case "NotAllowedError":
    case "SecurityError":
      return new ReadableError(
        `${device}_denied`,
        `${device === "mic" ? "Microphone" : "Camera"} access was denied. Allow it for this ` +
          "site in the browser's address bar or site settings, then try again." +
          (window.isSecureContext ? "" : " (This page is not a secure context: use https or localhost.)"),
      );
    case "NotFoundError":
    case "OverconstrainedError":
      return new ReadableError(
        `${device}_missing`,
        `No ${device === "mic" ? "microphone" : "camera"} was found (or the chosen one is gone).`,
      );
    case "NotReadableError":
      return new ReadableError(
        `${device}_busy`,
        `The ${device === "mic" ? "microphone" : "camera"} could not be opened: another application may be using it.`,
      );
    default:
      return new ReadableError(`${device}_error`, `Could not open the ${device === "mic" ? "microphone" : "camera"}: ${exc.message || exc.name}`);
  }
}

// --- settings ------------------------------------------------------------------------------

const NUMBER_FIELDS = {
  threshold: "vad-threshold",
  prefix_padding_ms: "prefix-padding",
  silence_duration_ms: "silence-duration",
  video_fps_idle: "fps-idle",
  video_fps_speaking: "fps-speaking",
  num_frames: "num-frames",
  max_frames: "max-frames",
};

function loadSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) ?? "{}");
  } catch {
    saved = {};
  }
  const settings = { ...DEFAULTS, ...saved };
  $("instructions").value = settings.instructions;
  for (const [name, id] of Object.entries(NUMBER_FIELDS)) $(id).value = String(settings[name]);
  $("vad-threshold-value").textContent = $("vad-threshold").value;
  $("api-key").value = sessionStorage.getItem(API_KEY_KEY) ?? "";
}

/** The form's settings, or null (with the bad field flagged) when one is out of range. */
function readSettings() {
  const settings = { instructions: $("instructions").value.trim() || DEFAULTS.instructions };
  for (const [name, id] of Object.entries(NUMBER_FIELDS)) {
    const input = $(id);
    if (!input.checkValidity() || input.value === "") {
      input.reportValidity();
      return null;
    }
    settings[name] = Number(input.value);
  }
  return settings;
}

function saveSettings(settings) {
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
}

/** The session object of client_secrets and session.update. */
function sessionBody(s) {
  return {
    type: "realtime",
    instructions: s.instructions,
    audio: {
      input: {
        turn_detection: {
          type: "server_vad",
          threshold: s.threshold,
          prefix_padding_ms: s.prefix_padding_ms,
          silence_duration_ms: s.silence_duration_ms,
          // Parley's extension: a backchannel ("uh-huh", "yeah") or a cough over the
          // answer holds it a moment and lets it go on; real speech still cuts it.
          interruption: "adaptive",
        },
      },
    },
    parley: {
      video: { num_frames: s.num_frames, max_frames: s.max_frames },
      video_fps_idle: s.video_fps_idle,
      video_fps_speaking: s.video_fps_speaking,
    },
  };
}

// --- devices -------------------------------------------------------------------------------

async function listDevices() {
  if (!navigator.mediaDevices?.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  fillPicker($("mic"), devices.filter((d) => d.kind === "audioinput"), "Microphone");
  fillPicker($("camera"), devices.filter((d) => d.kind === "videoinput"), "Camera");
}

function fillPicker(select, devices, noun) {
  const chosen = select.value;
  select.replaceChildren(new Option(`Default ${noun.toLowerCase()}`, ""));
  devices.forEach((d, i) => {
    if (!d.deviceId || d.deviceId === "default") return;
    select.append(new Option(d.label || `${noun} ${i + 1}`, d.deviceId));
  });
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
}

function micConstraints() {
  const id = $("mic").value;
  return {
    audio: {
      deviceId: id ? { exact: id } : undefined,
      echoCancellation: true,
      noiseSuppression: true,
      autoGainControl: true,
    },
  };
}

function cameraConstraints() {
  const id = $("camera").value;
  return {
    video: { deviceId: id ? { exact: id } : undefined, width: { ideal: 640 }, height: { ideal: 480 } },
  };
}

// --- level meters --------------------------------------------------------------------------

let audioContext = null;

function sharedAudioContext() {
  audioContext ??= new AudioContext();
  if (audioContext.state === "suspended") audioContext.resume().catch(() => {});
  return audioContext;
}

/** RMS level (0..1) of a stream's audio, read every METER_INTERVAL_MS into `onLevel`. */
class LevelMeter {
  constructor(stream, onLevel) {
    const ctx = sharedAudioContext();
    this.source = ctx.createMediaStreamSource(stream);
    this.analyser = ctx.createAnalyser();
    this.analyser.fftSize = 1024;
    this.samples = new Float32Array(this.analyser.fftSize);
    this.source.connect(this.analyser);
    this.timer = setInterval(() => {
      this.analyser.getFloatTimeDomainData(this.samples);
      let sum = 0;
      for (const x of this.samples) sum += x * x;
      onLevel(Math.sqrt(sum / this.samples.length), performance.now());
    }, METER_INTERVAL_MS);
  }

  close() {
    clearInterval(this.timer);
    this.source.disconnect();
  }
}

/** Bar width for an RMS level: -60 dBFS is empty, 0 dBFS is full. */
function meterPercent(level) {
  if (level <= 0) return 0;
  return Math.max(0, Math.min(100, ((20 * Math.log10(level) + 60) / 60) * 100));
}

function showLevel(el, level) {
  el.style.width = `${meterPercent(level).toFixed(1)}%`;
  el.dataset.level = level.toFixed(4);
  if (el.id === "remote-level" && level > Number(el.dataset.maxLevel ?? 0)) {
    el.dataset.maxLevel = level.toFixed(4);
  }
}

function setSpeaking(id, on) {
  const el = $(id);
  const value = on ? "true" : "false";
  if (el.dataset.on !== value) el.dataset.on = value;
}

// --- transcript ----------------------------------------------------------------------------

class Transcript {
  constructor(root) {
    this.root = root;
    this.users = new Map(); // item id -> line
    this.byResponse = new Map(); // response id -> line
    this.byItem = new Map(); // assistant item id -> line
    this.lastAssistant = null;
  }

  clear() {
    const hint = document.createElement("p");
    hint.className = "empty";
    hint.textContent = "Connected: start talking. What you say and what Parley answers appear here.";
    this.root.replaceChildren(hint);
    this.users.clear();
    this.byResponse.clear();
    this.byItem.clear();
    this.lastAssistant = null;
  }

  line(role) {
    this.root.querySelector(".empty")?.remove();
    const line = document.createElement("div");
    line.className = `line ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Parley";
    const text = document.createElement("span");
    text.className = "text";
    line.append(who, text);
    const atBottom = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 40;
    this.root.append(line);
    if (atBottom) this.root.scrollTop = this.root.scrollHeight;
    return line;
  }

  userLine(itemId) {
    let line = itemId && this.users.get(itemId);
    if (!line) {
      line = this.line("user");
      if (itemId) {
        line.dataset.itemId = itemId;
        this.users.set(itemId, line);
      }
    }
    return line;
  }

  /** The user's turn ended; its words arrive with the transcription event, if ever. */
  userStopped(itemId) {
    const line = itemId ? this.users.get(itemId) : null;
    if (line) line.dataset.ended = "true";
  }

  /** Turns answered without any transcription event (a pipeline with no recogniser). */
  settleUsers() {
    for (const line of this.users.values()) {
      const text = line.querySelector(".text");
      if (line.dataset.ended === "true" && !text.textContent) text.textContent = "(spoken; no transcript)";
    }
  }

  userTranscript(itemId, transcript) {
    const line = this.userLine(itemId);
    line.querySelector(".text").textContent = transcript.trim() || "(no words recognised)";
  }

  assistantLine(responseId, itemId) {
    let line = (responseId && this.byResponse.get(responseId)) || (itemId && this.byItem.get(itemId));
    if (!line) {
      line = this.line("assistant");
      if (responseId) {
        line.dataset.responseId = responseId;
        this.byResponse.set(responseId, line);
      }
    }
    if (itemId && !this.byItem.has(itemId)) {
      line.dataset.itemId = itemId;
      this.byItem.set(itemId, line);
    }
    this.lastAssistant = line;
    return line;
  }

  assistantDelta(responseId, itemId, delta) {
    const line = this.assistantLine(responseId, itemId);
    line.querySelector(".text").textContent += delta;
    const root = this.root;
    if (root.scrollHeight - root.scrollTop - root.clientHeight < 80) root.scrollTop = root.scrollHeight;
  }

  /** The answer was cut off where the listener stopped hearing it. */
  truncated(itemId) {
    const line = this.byItem.get(itemId) ?? this.lastAssistant;
    if (line) line.classList.add("cut");
  }

  responseDone(responseId, status, itemIds, reason) {
    const line = this.byResponse.get(responseId);
    if (!line) return;
    for (const id of itemIds) {
      if (!this.byItem.has(id)) this.byItem.set(id, line);
    }
    line.dataset.status = status;
    const text = line.querySelector(".text");
    if (status === "failed") {
      line.classList.add("failed");
      if (!text.textContent) text.textContent = `(failed${reason ? `: ${reason}` : ""})`;
    } else if (!text.textContent) {
      text.textContent = status === "cancelled" ? "(cancelled before it spoke)" : "(audio only)";
    }
  }
}

// --- latency -------------------------------------------------------------------------------

/**
 * Turn latency as the listener feels it: from the end of the user's speech to the first
 * sound of the answer. The end of speech is the last moment the page's own microphone meter
 * was above LOCAL_SPEECH_LEVEL before the server said speech_stopped; when that reading is
 * not usable (a noisy room), it is the arrival of speech_stopped minus the silence window.
 */
class LatencyTracker {
  constructor(list) {
    this.list = list;
    this.turns = 0;
    this.lastLoudAt = null;
    this.pending = null; // the turn waiting for its answer's first sound
  }

  micLevel(level, now) {
    if (level > LOCAL_SPEECH_LEVEL) this.lastLoudAt = now;
  }

  speechStopped(now, silenceMs) {
    const byVad = now - silenceMs;
    const loud = this.lastLoudAt;
    const usable = loud !== null && loud <= now && now - loud >= silenceMs / 2 && loud >= byVad - 2000;
    this.pending = {
      stoppedAt: now,
      endOfSpeech: usable ? loud : byVad,
      method: usable ? "microphone level" : "speech_stopped − silence window",
      responseAt: null,
    };
  }

  speechStarted() {
    // A new turn began before the last one was answered: that one gets no figure.
    this.pending = null;
  }

  responseCreated(now) {
    if (this.pending && this.pending.responseAt === null) this.pending.responseAt = now;
  }

  remoteLevel(level, now) {
    const turn = this.pending;
    if (!turn || turn.responseAt === null || level <= REMOTE_AUDIO_LEVEL) return;
    this.pending = null;
    this.turns += 1;
    const ms = Math.round(now - turn.endOfSpeech);
    const item = document.createElement("li");
    item.dataset.ms = String(ms);
    const figure = document.createElement("span");
    figure.className = "ms";
    figure.textContent = `${ms} ms`;
    const detail = document.createElement("span");
    detail.className = "detail";
    detail.textContent =
      ` — end of speech by ${turn.method}; response.created ` +
      `${Math.round(turn.responseAt - turn.stoppedAt)} ms after speech_stopped`;
    item.append(figure, detail);
    this.list.append(item);
    this.list.scrollTop = this.list.scrollHeight;
  }

  responseEnded() {
    if (this.pending && this.pending.responseAt !== null) this.pending = null;
  }
}

// --- the call ------------------------------------------------------------------------------

const transcript = new Transcript($("transcript"));
const latency = new LatencyTracker($("latency"));
let camera = null; // {stream, track}: the preview, owned by the page, lent to calls
let current = null; // the Call in progress

class Call {
  constructor(settings) {
    this.settings = settings;
    this.abort = new AbortController();
    this.closed = false;
    this.pc = null;
    this.channel = null;
    this.secret = null;
    this.callId = null;
    this.sessionId = null;
    this.mic = null;
    this.micSender = null;
    this.videoSender = null;
    this.micMeter = null;
    this.remoteMeter = null;
    this.responseId = null;
    this.overlaps = 0; // speech heard over the answer in progress
    this.assistantAudio = false; // between output_audio_buffer.started and stopped/cleared
    this.lastRemoteSound = -Infinity;
    this.updateTimer = null;
    this.resumeToken = null; // from session.created: what a re-attach proves itself with
    this.lastEventId = null; // the last server event got: where a re-attach picks up
    this.reattaching = false;
    this.disconnectedTimer = null;
  }

  async start() {
    const signal = this.abort.signal;
    setStatus("connecting", "opening the microphone…");
    try {
      this.mic = await navigator.mediaDevices.getUserMedia(micConstraints());
    } catch (exc) {
      throw mediaError(exc, "mic");
    }
    if (this.closed) {
      for (const track of this.mic.getTracks()) track.stop();
      return;
    }
    this.micMeter = new LevelMeter(this.mic, (level, now) => {
      showLevel($("local-level"), level);
      latency.micLevel(level, now);
    });
    listDevices().catch(() => {}); // labels are readable now

    setStatus("connecting", "asking the server for a session…");
    await this.mintSecret(signal);
    if (this.closed) return;

    await this.call({}, "starting the call");
  }

  /** A fresh ephemeral secret for the next offer: one lasts ten minutes, and a call that
   * re-attaches after that would be refused with the first. */
  async mintSecret(signal) {
    const headers = { "Content-Type": "application/json" };
    const apiKey = $("api-key").value.trim();
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const minted = await post(
      "/v1/realtime/client_secrets",
      { headers, body: JSON.stringify({ session: sessionBody(this.settings) }), signal },
      "getting a session secret",
    );
    if (!minted.ok) throw await httpError(minted, "getting a session secret");
    const secret = (await minted.json()).value;
    if (!secret) throw new ReadableError("bad_response", "The server sent no session secret.");
    this.secret = secret;
  }

  /** A new peer connection (the microphone, the camera, the event channel), its offer
   * POSTed with `headers` added, the answer applied. */
  async call(headers, what) {
    const pc = (this.pc = new RTCPeerConnection());
    pc.addEventListener("track", (event) => this.onTrack(event));
    pc.addEventListener("connectionstatechange", () => this.onConnectionState(pc));
    pc.addEventListener("iceconnectionstatechange", () => this.onIceState(pc));
    const [micTrack] = this.mic.getAudioTracks();
    this.micSender = pc.addTrack(micTrack, this.mic);
    this.videoSender = camera ? pc.addTrack(camera.track, camera.stream) : null;
    const channel = (this.channel = pc.createDataChannel("oai-events"));
    channel.addEventListener("message", (event) => this.onMessage(event.data));
    channel.addEventListener("close", () => {
      if (!this.closed && channel === this.channel && !this.reattaching) {
        this.end("ended", "the server closed the event channel");
      }
    });
    await pc.setLocalDescription(await pc.createOffer());
    setStatus("connecting", "gathering network candidates…");
    await iceGathered(pc, ICE_WAIT_MS);
    if (this.closed) return;

    setStatus("connecting", `${what}…`);
    const answer = await post(
      "/v1/realtime/calls",
      {
        headers: {
          "Content-Type": "application/sdp",
          Authorization: `Bearer ${this.secret}`,
          ...headers,
        },
        body: pc.localDescription.sdp,
        signal: this.abort.signal,
      },
      what,
    );
    if (!answer.ok) throw await httpError(answer, what);
    const where = answer.headers.get("Location") ?? "";
    this.callId = where.split("/").filter(Boolean).pop() ?? null;
    const sdp = await answer.text();
    if (this.closed) return;
    await pc.setRemoteDescription({ type: "answer", sdp });
    setStatus("connecting", "connecting media…");
  }

  /** The media connection is gone (a network change): call again into the same session,
   * with the same microphone; the server keeps the session a while for this. */
  async reattach() {
    if (this.closed || this.reattaching) return;
    if (!this.resumeToken || !this.sessionId) {
      this.end("failed", "media connection failed");
      return;
    }
    this.reattaching = true;
    clearTimeout(this.disconnectedTimer);
    setStatus("connecting", "the connection dropped: reconnecting…");
    this.channel?.close();
    this.pc?.close();
    const headers = {
      "X-Parley-Session-Id": this.sessionId,
      "X-Parley-Resume-Token": this.resumeToken,
    };
    if (this.lastEventId) headers["X-Parley-Last-Event-Id"] = this.lastEventId;
    try {
      await this.mintSecret(this.abort.signal); // the first may have expired meanwhile
      if (this.closed) return;
      await this.call(headers, "reconnecting the call");
    } catch (exc) {
      if (this.closed) return;
      const readable = exc instanceof ReadableError ? exc : new ReadableError("reattach_failed", `Could not reconnect: ${exc.message ?? exc}`);
      showError(readable.code, readable.message);
      this.end("failed", "the connection dropped and could not be restored", false);
    } finally {
      this.reattaching = false;
    }
  }

  /** What a network change does to the call, on purpose (for tests and trying it out). */
  dropConnection() {
    this.pc?.close(); // a closed connection reports no state change of its own
    this.reattach();
  }

  connected() {
    setStatus("connected", "connected");
    const parts = [this.callId && `call ${this.callId}`, this.sessionId && `session ${this.sessionId}`];
    $("call-info").textContent = parts.filter(Boolean).join(" · ");
  }

  onTrack(event) {
    if (event.track.kind !== "audio") return;
    const stream = event.streams[0] ?? new MediaStream([event.track]);
    const player = $("remote-audio");
    player.srcObject = stream;
    player.play().catch(() => {
      showError("autoplay", "The browser blocked the answer's sound: click anywhere on the page to hear it.");
      document.addEventListener("click", () => player.play().then(clearError, () => {}), { once: true });
    });
    this.remoteMeter?.close();
    this.remoteMeter = new LevelMeter(stream, (level, now) => this.onRemoteLevel(level, now));
  }

  onRemoteLevel(level, now) {
    showLevel($("remote-level"), level);
    if (level > REMOTE_AUDIO_LEVEL) this.lastRemoteSound = now;
    setSpeaking("assistant-speaking", this.assistantAudio || now - this.lastRemoteSound < ASSISTANT_HOLD_MS);
    latency.remoteLevel(level, now);
  }

  onConnectionState(pc) {
    if (this.closed || pc !== this.pc) return;
    const state = pc.connectionState;
    if (state === "connected") {
      this.connected();
    } else if (state === "failed" && !this.resumeToken) {
      showError(
        "ice_failed",
        "The media connection failed: the browser and the server could not reach each other over UDP.",
      );
      this.end("failed", "media connection failed");
    }
  }

  /** A call that was up and lost its path (failed, or disconnected for a few seconds)
   * is re-attached; a brief "disconnected" often recovers by itself. */
  onIceState(pc) {
    if (this.closed || pc !== this.pc) return;
    const state = pc.iceConnectionState;
    clearTimeout(this.disconnectedTimer);
    if (state === "failed" && this.resumeToken) {
      this.reattach();
    } else if (state === "disconnected") {
      setStatus("connecting", "connection interrupted, waiting for it to recover…");
      this.disconnectedTimer = setTimeout(() => {
        if (pc === this.pc && pc.iceConnectionState === "disconnected") this.reattach();
      }, DISCONNECTED_GRACE_MS);
    }
  }

  send(event) {
    if (this.channel?.readyState !== "open") return false;
    this.channel.send(JSON.stringify(event));
    logEvent("out", event);
    return true;
  }

  /** Settings changed during the call: tell the server (debounced). */
  update(settings) {
    this.settings = settings;
    clearTimeout(this.updateTimer);
    this.updateTimer = setTimeout(() => {
      this.send({ type: "session.update", session: sessionBody(this.settings) });
    }, 300);
  }

  async replaceMic() {
    const stream = await navigator.mediaDevices.getUserMedia(micConstraints());
    const [track] = stream.getAudioTracks();
    await this.micSender?.replaceTrack(track);
    for (const old of this.mic?.getTracks() ?? []) old.stop();
    this.mic = stream;
    this.micMeter?.close();
    this.micMeter = new LevelMeter(stream, (level, now) => {
      showLevel($("local-level"), level);
      latency.micLevel(level, now);
    });
  }

  onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    logEvent("in", event);
    if (event.event_id) this.lastEventId = event.event_id;
    const now = performance.now();
    const responseId = event.response?.id ?? event.response_id ?? null;
    switch (event.type) {
      case "session.created":
        this.sessionId = event.session?.id ?? null;
        this.resumeToken = event.session?.parley?.resume_token ?? null;
        this.connected();
        break;
      case "input_audio_buffer.speech_started":
        if (this.responseId) this.overlaps += 1;
        setSpeaking("user-speaking", true);
        if (this.responseId || this.assistantAudio) $("barge-in").hidden = false;
        latency.speechStarted();
        transcript.userLine(event.item_id);
        break;
      case "input_audio_buffer.speech_stopped":
        setSpeaking("user-speaking", false);
        latency.speechStopped(now, this.settings.silence_duration_ms);
        transcript.userStopped(event.item_id);
        break;
      case "conversation.item.input_audio_transcription.completed":
        transcript.userTranscript(event.item_id, event.transcript ?? "");
        break;
      case "response.created":
        this.responseId = responseId;
        this.overlaps = 0;
        $("cancel").disabled = false;
        $("barge-in").hidden = true;
        latency.responseCreated(now);
        transcript.assistantLine(responseId, null);
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        transcript.assistantDelta(responseId, event.item_id, event.delta ?? "");
        break;
      case "output_audio_buffer.started":
        this.assistantAudio = true;
        setSpeaking("assistant-speaking", true);
        break;
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this.assistantAudio = false;
        break;
      case "conversation.item.truncated":
        transcript.truncated(event.item_id);
        break;
      case "response.done": {
        const response = event.response ?? event;
        const items = (response.output ?? []).map((item) => item.id).filter(Boolean);
        if (event.item?.id) items.push(event.item.id);
        const reason = response.status_details?.error?.message ?? response.status_details?.reason ?? event.reason;
        transcript.responseDone(responseId, response.status ?? "completed", items, reason);
        if (responseId === this.responseId && this.overlaps && response.status === "completed") {
          const times = this.overlaps > 1 ? ` (${this.overlaps} times)` : "";
          logNote(`kept: speech over this answer${times} was a backchannel or a noise; the answer played on whole`);
        }
        transcript.settleUsers();
        if (responseId === this.responseId) {
          this.responseId = null;
          $("cancel").disabled = true;
        }
        latency.responseEnded();
        break;
      }
      case "error": {
        const err = event.error ?? event;
        if (err.code === "session_limit") {
          showError("session_limit", `The server is at its session limit: ${err.message}`);
        } else {
          showError(err.code || "server_error", `Server error${err.code ? ` (${err.code})` : ""}: ${err.message ?? "unknown"}`);
        }
        break;
      }
      case "session.closed":
        this.end("ended", `session closed by the server${event.reason ? `: ${event.reason}` : ""}`, false);
        break;
      default:
        break;
    }
  }

  /** Ends the call; idempotent. `notify` asks the server to hang up first. */
  async end(state, text, notify = true) {
    if (this.closed) return;
    this.closed = true;
    this.abort.abort();
    clearTimeout(this.updateTimer);
    clearTimeout(this.disconnectedTimer);
    setStatus(state, text);
    $("call-info").textContent = "";
    if (notify && this.callId && this.secret) {
      const url = `/v1/realtime/calls/${encodeURIComponent(this.callId)}/hangup`;
      await Promise.race([
        fetch(url, {
          method: "POST",
          headers: { Authorization: `Bearer ${this.secret}` },
          keepalive: true,
        }).catch(() => {}),
        delay(HANGUP_WAIT_MS),
      ]);
    }
    this.channel?.close();
    this.pc?.close();
    this.micMeter?.close();
    this.remoteMeter?.close();
    for (const track of this.mic?.getTracks() ?? []) track.stop();
    $("remote-audio").srcObject = null;
    showLevel($("local-level"), 0);
    showLevel($("remote-level"), 0);
    setSpeaking("user-speaking", false);
    setSpeaking("assistant-speaking", false);
    $("barge-in").hidden = true;
    if (current === this) {
      current = null;
      $("connect").disabled = false;
      $("hangup").disabled = true;
      $("cancel").disabled = true;
    }
    checkServer();
  }
}

async function connect() {
  if (current) return;
  const settings = readSettings();
  if (!settings) return;
  clearError();
  sharedAudioContext(); // inside the click, so the browser lets it run
  transcript.clear();
  $("latency").replaceChildren();
  $("remote-level").dataset.maxLevel = "0";
  const call = (current = new Call(settings));
  $("connect").disabled = true;
  $("hangup").disabled = false;
  try {
    await call.start();
  } catch (exc) {
    if (call.closed) return; // hung up while connecting
    const readable = exc instanceof ReadableError ? exc : new ReadableError("error", `Could not connect: ${exc.message ?? exc}`);
    showError(readable.code, readable.message);
    await call.end("failed", "not connected", Boolean(call.callId));
  }
}

async function hangup() {
  await current?.end("ended", "call ended");
}

// --- camera --------------------------------------------------------------------------------

async function setCamera(on) {
  const box = $("preview").parentElement;
  if (camera) {
    for (const track of camera.stream.getTracks()) track.stop();
    camera = null;
  }
  if (on) {
    try {
      const stream = await navigator.mediaDevices.getUserMedia(cameraConstraints());
      camera = { stream, track: stream.getVideoTracks()[0] };
      listDevices().catch(() => {});
    } catch (exc) {
      const readable = mediaError(exc, "camera");
      showError(readable.code, readable.message);
      $("camera-on").checked = false;
    }
  }
  $("preview").srcObject = camera?.stream ?? null;
  box.dataset.on = camera ? "true" : "false";
  if (current?.videoSender) {
    await current.videoSender.replaceTrack(camera?.track ?? null);
  } else if (current && camera) {
    showError("camera_next_call", "The camera joins from the next call (this call started without video).");
  }
}

// --- server readiness ----------------------------------------------------------------------

async function checkServer() {
  const el = $("server");
  try {
    const response = await fetch("/readyz", { cache: "no-store" });
    const body = await response.json();
    if (response.ok) {
      el.dataset.state = "ready";
      el.textContent = `ready — pipeline ${body.pipeline}, ${body.sessions}/${body.max_sessions} sessions`;
    } else {
      el.dataset.state = "unavailable";
      el.textContent = `not ready: ${(body.reasons ?? []).join("; ")}`;
    }
  } catch {
    el.dataset.state = "unreachable";
    el.textContent = "unreachable";
  }
}

// --- wiring --------------------------------------------------------------------------------

function onSettingsChanged() {
  $("vad-threshold-value").textContent = $("vad-threshold").value;
  const settings = readSettings();
  if (!settings) return;
  saveSettings(settings);
  current?.update(settings);
}

function main() {
  loadSettings();
  $("connect").addEventListener("click", connect);
  $("hangup").addEventListener("click", hangup);
  $("cancel").addEventListener("click", () => current?.send({ type: "response.cancel" }));
  $("settings").addEventListener("submit", (event) => event.preventDefault());
  $("settings").addEventListener("change", (event) => {
    if (event.target.id === "api-key") {
      sessionStorage.setItem(API_KEY_KEY, event.target.value.trim());
      return;
    }
    onSettingsChanged();
  });
  $("vad-threshold").addEventListener("input", () => {
    $("vad-threshold-value").textContent = $("vad-threshold").value;
  });
  $("reset-settings").addEventListener("click", () => {
    localStorage.removeItem(SETTINGS_KEY);
    loadSettings();
    onSettingsChanged();
  });
  $("camera-on").addEventListener("change", (event) => setCamera(event.target.checked));
  $("camera").addEventListener("change", () => {
    if ($("camera-on").checked) setCamera(true);
  });
  $("mic").addEventListener("change", () => {
    current?.replaceMic().catch((exc) => {
      const readable = mediaError(exc, "mic");
      showError(readable.code, readable.message);
    });
  });
  navigator.mediaDevices?.addEventListener?.("devicechange", () => listDevices().catch(() => {}));
  window.addEventListener("pagehide", () => current?.end("ended", "page closed"));
  if (!navigator.mediaDevices?.getUserMedia || !window.RTCPeerConnection) {
    showError(
      "unsupported",
      window.isSecureContext
        ? "This browser cannot make WebRTC calls."
        : "Microphone access needs a secure page: open it over https, or as http://localhost.",
    );
    $("connect").disabled = true;
  }
  listDevices().catch(() => {});
  checkServer();
  window.parleyDemo = { dropConnection: () => current?.dropConnection() };
}

main();
