// The call page: one WebRTC call to the voice agent, its live transcript and turn latency.
//
// The server sends this session's pipeline events as JSON over the "events" data channel.
// The page also measures the turn gap itself: from the last moment the microphone carried
// speech to the first moment the agent's voice arrives here, both read from WebAudio meters.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const RECORD = params.has("record"); // keep the received agent audio (tests, debugging)

const CALLER_VOICE_DB = -50; // microphone level above which the caller is speaking
const AGENT_VOICE_DB = -45; // received level above which the agent is speaking
const AGENT_ONSET_QUIET_MS = 300; // agent audio after this much quiet starts a new reply
const RETRIES = 3;

const state = {
  pc: null, dc: null, mic: null, ctx: null, micAn: null, agentAn: null, timer: null,
  recorder: null, sessionId: null, userHangup: false, retries: 0, retryTimer: null,
  disconnectTimer: null, lastCallerVoice: null, callerSpoke: false, agentQuietSince: 0,
  lastTick: 0, muted: false,
};

// Everything the page saw, for people debugging and for the browser tests.
const va = (window.voiceAgent = {
  state: "idle", sessionId: null, events: [], turns: [], partials: [], browserGaps: [],
  errors: [], agentVoicedMs: 0, agentPeakDb: -120, recording: [], recordingRate: 0,
  takeRecording, connectionInfo,
});

const shownTurns = new Set(); // turn indices of this call already in the transcript

// token: from ?token=..., kept for this tab only, and removed from the address bar
let token = params.get("token") || sessionStorage.getItem("voiceAgentToken") || "";
if (params.has("token")) {
  sessionStorage.setItem("voiceAgentToken", token);
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : ""));
}
if (!token) $("token-row").hidden = false;

function setStatus(kind, text) {
  va.state = kind;
  const el = $("status");
  el.className = `pill ${kind}`;
  el.textContent = text || kind.replace("-", " ");
}

function showError(text) {
  va.errors.push(text);
  $("error-text").textContent = text;
  $("error").hidden = false;
  setStatus("error", "error");
}

function hideError() {
  $("error").hidden = true;
}

function setButtons(inCall) {
  $("call").disabled = inCall;
  $("mute").disabled = !inCall;
  $("hangup").disabled = !inCall;
}

async function call() {
  clearTimeout(state.retryTimer);
  if (state.pc) return;
  token = $("token-row").hidden ? token : $("token").value.trim() || token;
  if (!token) {
    $("token-row").hidden = false;
    showError("Enter the token the server printed when it started.");
    return;
  }
  sessionStorage.setItem("voiceAgentToken", token);
  hideError();
  setStatus("connecting");
  setButtons(true);
  state.userHangup = false;
  shownTurns.clear(); // a new call numbers its turns from 0 again
  try {
    // created inside the click: browsers only let audio start from a user gesture
    state.ctx = state.ctx || new AudioContext({ latencyHint: "interactive" });
    await state.ctx.resume();
    state.mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    const pc = new RTCPeerConnection({ iceServers: [] });
    state.pc = pc;
    const dc = pc.createDataChannel("events");
    state.dc = dc;
    dc.onmessage = (e) => onEvent(e.data);
    dc.onclose = () => state.pc === pc && lost("the event channel closed");
    for (const track of state.mic.getAudioTracks()) pc.addTrack(track, state.mic);
    pc.ontrack = (e) => attachAgentAudio(e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => onConnectionState(pc);
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc, 2000);
    const resp = await fetch("offer", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer" }),
    });
    const body = await resp.json().catch(() => ({}));
    if (!resp.ok) {
      const err = new Error(body.error || `HTTP ${resp.status}`);
      err.retry = resp.status >= 500;
      if (resp.status === 401 || resp.status === 403) $("token-row").hidden = false;
      throw err;
    }
    state.sessionId = va.sessionId = body.session_id;
    await pc.setRemoteDescription({ type: "answer", sdp: body.sdp });
    attachMic(state.mic);
    startMeters();
  } catch (err) {
    teardown();
    const name = err.name === "NotAllowedError" ? "microphone permission was denied" : err.message;
    if (err.retry && state.retries < RETRIES) lost(`Call failed: ${name}`);
    else showError(`Call failed: ${name}`);
  }
}

function iceGathered(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => pc.iceGatheringState === "complete" && resolve();
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, timeoutMs); // send what we have; the server does not trickle
  });
}

function onConnectionState(pc) {
  if (state.pc !== pc) return;
  clearTimeout(state.disconnectTimer);
  const s = pc.connectionState;
  if (s === "connected") {
    state.retries = 0;
    hideError();
    setStatus("in-call", "in call");
  } else if (s === "failed") {
    lost("the connection failed");
  } else if (s === "disconnected") {
    // often recovers by itself within a few seconds
    state.disconnectTimer = setTimeout(() => state.pc === pc && lost("the connection dropped"), 4000);
  }
}

function lost(reason) {
  if (state.userHangup) return;
  teardown();
  if (state.retries < RETRIES) {
    state.retries += 1;
    const delay = 1000 * 2 ** (state.retries - 1);
    showError(`${reason}; reconnecting in ${delay / 1000} s (try ${state.retries} of ${RETRIES})…`);
    state.retryTimer = setTimeout(call, delay);
  } else {
    showError(`${reason}. Press Reconnect to call again.`);
  }
}

function hangup() {
  state.userHangup = true;
  clearTimeout(state.retryTimer);
  if (state.dc && state.dc.readyState === "open") state.dc.send(JSON.stringify({ type: "hangup" }));
  // give the hangup message a moment to leave before the connection closes
  setTimeout(() => {
    teardown();
    setStatus("idle", "call ended");
  }, 150);
}

function teardown() {
  clearTimeout(state.disconnectTimer);
  clearInterval(state.timer);
  state.timer = null;
  const pc = state.pc;
  state.pc = null;
  state.dc = null;
  if (pc) pc.close();
  if (state.mic) state.mic.getTracks().forEach((t) => t.stop());
  state.mic = null;
  state.micAn = state.agentAn = null;
  if (state.recorder) state.recorder.disconnect();
  state.recorder = null;
  state.muted = false;
  $("mute").textContent = "Mute";
  $("mute").setAttribute("aria-pressed", "false");
  setButtons(false);
  setMeter("mic-level", -120);
  setMeter("agent-level", -120);
}

function toggleMute() {
  if (!state.mic) return;
  state.muted = !state.muted;
  // a disabled track still sends (silent) audio, so the server keeps the call alive
  state.mic.getAudioTracks().forEach((t) => (t.enabled = !state.muted));
  $("mute").textContent = state.muted ? "Unmute" : "Mute";
  $("mute").setAttribute("aria-pressed", String(state.muted));
}

// audio meters and the browser-side turn gap
function analyser(stream) {
  const an = state.ctx.createAnalyser();
  an.fftSize = 512;
  state.ctx.createMediaStreamSource(stream).connect(an);
  an.buf = new Float32Array(an.fftSize);
  return an;
}

function attachMic(stream) {
  state.micAn = analyser(stream);
}

function attachAgentAudio(stream) {
  // Chrome only feeds a remote stream into WebAudio while a media element plays it
  const el = $("agent-audio");
  el.srcObject = stream;
  el.play().catch(() => showError("The browser blocked audio playback; click anywhere on the page."));
  state.agentAn = analyser(stream);
  if (RECORD) startRecorder(stream);
}

function levelDb(an) {
  if (!an) return -120;
  an.getFloatTimeDomainData(an.buf);
  let sum = 0;
  for (const x of an.buf) sum += x * x;
  return 10 * Math.log10(sum / an.buf.length + 1e-12);
}

function setMeter(id, db) {
  const pct = Math.max(0, Math.min(100, ((db + 70) / 70) * 100));
  $(id).style.setProperty("--level", `${pct}%`);
}

function startMeters() {
  clearInterval(state.timer);
  state.lastTick = performance.now();
  state.agentQuietSince = performance.now();
  state.timer = setInterval(tick, 10);
}

function tick() {
  const now = performance.now();
  const dt = now - state.lastTick;
  state.lastTick = now;
  const micDb = state.muted ? -120 : levelDb(state.micAn);
  const agentDb = levelDb(state.agentAn);
  setMeter("mic-level", micDb);
  setMeter("agent-level", agentDb);
  if (micDb > CALLER_VOICE_DB) {
    state.lastCallerVoice = now;
    state.callerSpoke = true;
  }
  if (agentDb > AGENT_VOICE_DB) {
    va.agentVoicedMs += dt;
    va.agentPeakDb = Math.max(va.agentPeakDb, agentDb);
    const quietFor = state.agentQuietSince === null ? 0 : now - state.agentQuietSince;
    if (quietFor >= AGENT_ONSET_QUIET_MS && state.callerSpoke && state.lastCallerVoice !== null) {
      reportBrowserGap(Math.max(0, now - state.lastCallerVoice));
      state.callerSpoke = false;
    }
    state.agentQuietSince = null;
  } else if (state.agentQuietSince === null) {
    state.agentQuietSince = now;
  }
}

function reportBrowserGap(gapMs) {
  const n = va.browserGaps.length + 1;
  va.browserGaps.push(gapMs);
  latencyRow(n).browser.textContent = `${Math.round(gapMs)} ms`;
  summarize();
  if (state.dc && state.dc.readyState === "open") {
    state.dc.send(JSON.stringify({ type: "client_gap", turn: n, gap_ms: gapMs }));
  }
}

const RECORDER_JS = `
class Recorder extends AudioWorkletProcessor {
  process(inputs) { const ch = inputs[0] && inputs[0][0]; if (ch) this.port.postMessage(ch.slice(0)); return true; }
}
registerProcessor("recorder", Recorder);`;

async function startRecorder(stream) {
  const url = URL.createObjectURL(new Blob([RECORDER_JS], { type: "application/javascript" }));
  await state.ctx.audioWorklet.addModule(url);
  const node = new AudioWorkletNode(state.ctx, "recorder");
  node.port.onmessage = (e) => va.recording.push(e.data);
  va.recordingRate = state.ctx.sampleRate;
  const mute = state.ctx.createGain();
  mute.gain.value = 0; // pulled by the destination, heard by nobody
  state.ctx.createMediaStreamSource(stream).connect(node).connect(mute).connect(state.ctx.destination);
  state.recorder = node;
}

function takeRecording() {
  // the agent audio received so far, as base64 little-endian int16 at recordingRate
  const n = va.recording.reduce((a, c) => a + c.length, 0);
  const pcm = new Int16Array(n);
  let i = 0;
  for (const chunk of va.recording) for (const x of chunk) pcm[i++] = Math.max(-1, Math.min(1, x)) * 32767;
  va.recording = [];
  let bin = "";
  const bytes = new Uint8Array(pcm.buffer);
  for (let j = 0; j < bytes.length; j += 0x8000) bin += String.fromCharCode(...bytes.subarray(j, j + 0x8000));
  return { rate: va.recordingRate, pcm: btoa(bin) };
}

async function connectionInfo() {
  // the addresses and codec the call actually uses, from WebRTC statistics
  if (!state.pc) return null;
  const stats = [...(await state.pc.getStats()).values()];
  const byId = new Map(stats.map((s) => [s.id, s]));
  const pair = stats.find((s) => s.type === "candidate-pair" && s.nominated && s.state === "succeeded");
  const inbound = stats.find((s) => s.type === "inbound-rtp" && s.kind === "audio");
  const codec = inbound && byId.get(inbound.codecId);
  return {
    local: pair && byId.get(pair.localCandidateId)?.address,
    remote: pair && byId.get(pair.remoteCandidateId)?.address,
    codec: codec && `${codec.mimeType}/${codec.clockRate}`,
    jitterMs: inbound && inbound.jitter * 1000,
    packetsLost: inbound && inbound.packetsLost,
  };
}

// server events
function onEvent(data) {
  let ev;
  try {
    ev = JSON.parse(data);
  } catch {
    return;
  }
  va.events.push(ev);
  switch (ev.type) {
    case "partial":
      va.partials.push(ev.text);
      renderPartial(ev.stable || "", ev.text || "");
      break;
    case "speech_start":
      if (!$("partial").textContent) $("partial").textContent = "…";
      break;
    case "turn":
      onTurn(ev.report || {});
      break;
    case "interrupt":
      onInterrupt(ev);
      break;
    case "session/end":
      $("ended").textContent = `Call ended (${ev.reason}), ${ev.turns} turn${ev.turns === 1 ? "" : "s"}.`;
      break;
    case "hangup":
      state.userHangup = true;
      teardown();
      setStatus("idle", "the agent hung up");
      break;
    case "error":
      showError(`Server: ${ev.message}`);
      break;
  }
}

const STAGE_NAMES = { vad_endpoint: "endpoint", asr_final: "asr", llm_block: "llm", tts_first_audio: "tts", output: "out" };

function onInterrupt(ev) {
  // the caller talked over the agent; a reply cut short before it was fully queued has no
  // turn report, so show what the caller said (last partial) and what they heard
  if (!shownTurns.has(ev.turn)) {
    shownTurns.add(ev.turn);
    const said = va.partials[va.partials.length - 1];
    if (said) line("caller", "you", said);
    line("agent", "agent", ev.heard_text || "…");
  }
  const last = [...document.querySelectorAll("#transcript li.agent")].pop();
  if (last) last.classList.add("interrupted");
}

function onTurn(r) {
  // r is the turn's report (pipelines/report.py TurnRecord)
  if (shownTurns.has(r.index)) return;
  shownTurns.add(r.index);
  const n = va.turns.length + 1;
  va.turns.push({ turn: n, user: r.transcript || "", reply: r.response || "", gapMs: r.gap_ms, report: r });
  renderPartial("", "");
  if (r.transcript) line("caller", "you", r.transcript);
  if (r.response) line("agent", "agent", r.response);
  const row = latencyRow(n);
  if (typeof r.gap_ms === "number") row.server.textContent = `${Math.round(r.gap_ms)} ms`;
  const late = new Set((r.violations || []).map((v) => v.stage));
  if (late.size) row.server.classList.add("late");
  row.stages.textContent = "";
  for (const [key, name] of Object.entries(STAGE_NAMES)) {
    const ms = (r.stages || {})[key];
    if (typeof ms !== "number") continue;
    const span = document.createElement("span");
    span.textContent = `${name} ${Math.round(ms)}`;
    if (late.has(key)) span.className = "late";
    row.stages.append(span);
  }
  summarize();
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)] : null;
}

function summarize() {
  const server = va.turns.map((t) => t.gapMs).filter((x) => typeof x === "number");
  const parts = [];
  if (server.length) parts.push(`server median ${Math.round(median(server))} ms`);
  if (va.browserGaps.length) parts.push(`browser median ${Math.round(median(va.browserGaps))} ms`);
  $("summary").textContent = parts.length ? `Turn gap: ${parts.join(", ")}.` : "";
}

function line(cls, who, text) {
  const li = document.createElement("li");
  li.className = cls;
  const w = document.createElement("span");
  w.className = "who";
  w.textContent = who;
  li.append(w, document.createTextNode(text));
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
}

function renderPartial(stable, text) {
  const el = $("partial");
  el.textContent = "";
  if (!text) return;
  const b = document.createElement("b");
  b.textContent = stable;
  const rest = text.startsWith(stable) ? text.slice(stable.length) : ` ${text}`;
  el.append(b, document.createTextNode(stable ? rest : text));
}

function latencyRow(n) {
  let tr = document.getElementById(`turn-${n}`);
  if (!tr) {
    tr = document.createElement("tr");
    tr.id = `turn-${n}`;
    for (let i = 0; i < 4; i++) tr.append(document.createElement("td"));
    tr.cells[0].textContent = String(n);
    tr.cells[3].className = "stages";
    $("latency-rows").append(tr);
  }
  return { server: tr.cells[1], browser: tr.cells[2], stages: tr.cells[3] };
}

$("controls").onsubmit = (e) => {
  e.preventDefault();
  state.retries = 0;
  call();
};
$("reconnect").onclick = () => {
  state.retries = 0;
  teardown();
  call();
};
$("hangup").onclick = hangup;
$("mute").onclick = toggleMute;
window.addEventListener("pagehide", () => {
  if (state.sessionId && state.pc) {
    navigator.sendBeacon(`calls/${state.sessionId}/hangup`, JSON.stringify({ token }));
  }
});
