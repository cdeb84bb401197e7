// The live page: microphone -> WebSocket (protocol MIC frames), reply audio through Web
// Audio on the turn clock, the face drawn from the ARKit-52 frames on the same clock: the
// photo portrait (portrait.js, WebGL) when the gateway has a rig, else a cartoon (2D canvas).
// docs/protocol.md describes every message. window.liveStats is read by the browser tests.
"use strict";
const $ = (id) => document.getElementById(id);
const stats = (window.liveStats = {
  ready: false, transcripts: [], partials: [], sentences: 0, audioChunks: 0, framesChunks: 0,
  framesDrawn: 0, turnEnds: [], interrupts: 0, errors: [], firstAudioMs: [],
  face: "cartoon", portraitReady: false, portraitError: null, portraitFramesDrawn: 0,
});
let ws = null, ctx = null, names = [], index = {};
let portrait = null, held = null;  // the WebGL portrait once loaded; faceTest's values
let redraw = false;  // the portrait draws only when its input changed, or when this is set
let turn = { number: 0, clock: null, frames: [], sources: [], endedSpeechAt: null };

function log(text, cls = "info") {
  const line = document.createElement("div");
  line.className = cls;
  line.textContent = text;
  $("log").appendChild(line);
  $("log").scrollTop = $("log").scrollHeight;
  return line;
}

// Live captions: one line, rewritten by each partial transcript, until the turn's own
// transcript replaces it (or the utterance is dropped as too short).
let hearing = null;
function showHearing(text) {
  if (hearing === null) hearing = log("", "hearing");
  hearing.textContent = "you (hearing): " + text + " …";
  $("log").scrollTop = $("log").scrollHeight;
}
function endHearing() { if (hearing !== null) hearing.remove(); hearing = null; }

function send(obj) { if (ws && ws.readyState === 1) ws.send(JSON.stringify(obj)); }

function sendControls() {
  const controls = {
    emotion: $("emotion").value, intensity: +$("intensity").value,
    alpha: +$("alpha").value, fps: +$("fps").value, end_silence_s: +$("silence").value,
  };
  // the operator's personas by name; free text only where the gateway allows it
  if ($("persona").value.trim() && !$("persona").hidden) controls.persona = $("persona").value.trim();
  else controls.persona_preset = $("persona-preset").value;
  send({ type: "controls", controls });
}

function stopPlayback() {
  for (const s of turn.sources) { try { s.stop(); } catch (e) { /* already ended */ } }
  turn.sources = [];
  turn.frames = [];
}

function onAudio(view, data) {
  const sentence = view.getUint16(1, true), number = view.getUint32(3, true);
  const start = view.getFloat32(7, true), rate = view.getUint32(11, true);
  if (number !== turn.number) return;  // a cancelled turn's late data
  const pcm = new Int16Array(data.slice(15));
  const buffer = ctx.createBuffer(1, pcm.length, rate);
  const channel = buffer.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
  if (turn.clock === null) {
    turn.clock = ctx.currentTime + 0.05;  // the turn clock's zero on the context clock
    if (turn.endedSpeechAt !== null) stats.firstAudioMs.push(performance.now() - turn.endedSpeechAt);
  }
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  source.connect(ctx.destination);
  source.start(Math.max(ctx.currentTime, turn.clock + start));
  turn.sources.push(source);
  stats.audioChunks += 1;
}

function onFrames(view, data) {
  const number = view.getUint32(3, true), start = view.getFloat32(7, true);
  const fps = view.getFloat32(11, true), count = view.getUint16(15, true), width = view.getUint16(17, true);
  if (number !== turn.number) return;
  const rows = new Float32Array(data.slice(19));
  turn.frames.push({ start, fps, count, width, rows });
  stats.framesChunks += 1;
}

function weight(row, name) { return row ? row[index[name]] || 0 : 0; }

function currentRow() {
  if (!ctx || turn.clock === null || !turn.frames.length) return null;
  const t = ctx.currentTime - turn.clock;
  for (const f of turn.frames) {
    const i = Math.floor((t - f.start) * f.fps);
    if (i >= 0 && i < f.count) return f.rows.subarray(i * f.width, (i + 1) * f.width);
  }
  return null;
}

// One face per animation frame, from the reply's current row (or faceTest's values).
function draw() {
  const row = currentRow();
  if (row) stats.framesDrawn += 1;
  drawFace(held ? (n) => held[n] || 0 : (n) => weight(row, n), redraw);
  redraw = false;
  requestAnimationFrame(draw);
}

function drawFace(w, force = false) {
  if (stats.face === "portrait") {
    try {
      if (portrait.draw(w, force)) stats.portraitFramesDrawn += 1;
      return;
    } catch (e) {  // a lost WebGL context: the cartoon takes over
      portraitFailed(e);
    }
  }
  drawCartoon(w);
}

function drawCartoon(w) {
  const c = $("face").getContext("2d");
  c.clearRect(0, 0, 400, 400);
  c.save();
  c.translate(200 + 60 * w("headYaw"), 210 - 60 * w("headPitch"));
  c.rotate(w("headRoll"));
  c.fillStyle = "#f1c7a3";
  c.beginPath(); c.ellipse(0, 0, 120, 150, 0, 0, 2 * Math.PI); c.fill();
  for (const side of ["Left", "Right"]) {
    const x = side === "Left" ? -45 : 45;
    const open = Math.max(0.05, 1 - w("eyeBlink" + side)) * (1 + 0.4 * w("eyeWide" + side));
    c.fillStyle = "#fff";
    c.beginPath(); c.ellipse(x, -30, 20, 12 * open, 0, 0, 2 * Math.PI); c.fill();
    c.fillStyle = "#3b2a20";
    c.beginPath(); c.ellipse(x, -30, 7, 7 * Math.min(1, open), 0, 0, 2 * Math.PI); c.fill();
    const brow = -58 - 14 * w("browInnerUp") - 10 * w("browOuterUp" + side) + 10 * w("browDown" + side);
    c.strokeStyle = "#5a3d2b"; c.lineWidth = 5;
    c.beginPath(); c.moveTo(x - 22, brow + 3); c.lineTo(x + 22, brow); c.stroke();
  }
  const jaw = w("jawOpen"), smile = (w("mouthSmileLeft") + w("mouthSmileRight")) / 2;
  const frown = (w("mouthFrownLeft") + w("mouthFrownRight")) / 2;
  const pucker = Math.max(w("mouthPucker"), w("mouthFunnel"));
  const closed = Math.max(w("mouthClose"), (w("mouthPressLeft") + w("mouthPressRight")) / 2);
  const half = 42 * (1 + 0.35 * smile + 0.25 * (w("mouthStretchLeft") + w("mouthStretchRight")) / 2) * (1 - 0.45 * pucker);
  const open = 46 * jaw * (1 - 0.8 * closed);
  const corner = 12 * (frown - smile);
  c.fillStyle = "#7a2330";
  c.beginPath();
  c.moveTo(-half, 70 + corner);
  c.quadraticCurveTo(0, 62 - 4 * smile, half, 70 + corner);
  c.quadraticCurveTo(0, 76 + open * 2, -half, 70 + corner);
  c.fill();
  c.restore();
}

function setFace(style) {
  stats.face = style === "portrait" && portrait ? "portrait" : "cartoon";
  $("face-style").value = stats.face;
  $("portrait").hidden = stats.face !== "portrait";
  $("face").hidden = stats.face === "portrait";
  redraw = true;
}

function portraitFailed(error) {
  portrait = null;
  stats.portraitReady = false;
  stats.portraitError = String(error && error.message ? error.message : error);
  $("face-style").querySelector("option[value=portrait]").disabled = true;
  setFace("cartoon");
}

// The portrait is the default when the gateway serves a rig (/portrait/info) and WebGL
// draws it; otherwise the page keeps the cartoon.
async function loadPortrait() {
  const info = await (await fetch("/portrait/info")).json();
  if (!info.available) throw new Error("the gateway serves no portrait rig (--portrait)");
  portrait = await window.Portrait.create($("portrait"), info);
  stats.portraitReady = true;
  setFace("portrait");
}

function onMessage(event) {
  if (typeof event.data !== "string") {
    const view = new DataView(event.data);
    if (view.getUint8(0) === 2) onAudio(view, event.data);
    else if (view.getUint8(0) === 3) onFrames(view, event.data);
    return;
  }
  const m = JSON.parse(event.data);
  switch (m.type) {
    case "ready": {
      // a page that reconnects goes on with its conversation (the token is the key to it)
      const saved = sessionStorage.getItem("avatarSession");
      if (saved && saved !== m.session_token) send({ type: "resume", session_token: saved });
      else sessionStorage.setItem("avatarSession", m.session_token);
      const presets = $("persona-preset");
      presets.replaceChildren(new Option("(the server's)", ""), ...m.personas.map((n) => new Option(n, n)));
      $("persona").hidden = !m.persona_text;
      names = m.frames.names;
      names.forEach((n, i) => (index[n] = i));
      stats.ready = true;
      $("status").textContent = "listening";
      sendControls();
      break;
    }
    case "session": sessionStorage.setItem("avatarSession", m.session_token); break;
    case "speech_start": $("status").textContent = "hearing you"; break;
    case "speech_end": if (!m.utterance_s) endHearing(); turn.endedSpeechAt = performance.now(); $("status").textContent = "thinking"; break;
    case "turn_start":
      stopPlayback();
      turn = { number: m.turn, clock: null, frames: [], sources: [], endedSpeechAt: m.input === "audio" ? turn.endedSpeechAt : performance.now() };
      break;
    case "partial_transcript": stats.partials.push(m.text); showHearing(m.text); break;
    case "transcript": endHearing(); stats.transcripts.push(m.text); log("you: " + m.text, "user"); break;
    case "sentence": stats.sentences += 1; log(`avatar (${m.emotion}): ${m.text}`, "avatar"); $("status").textContent = "speaking"; break;
    case "interrupt": stats.interrupts += 1; stopPlayback(); log(`(interrupted: ${m.reason})`); break;
    case "turn_end":
      stats.turnEnds.push(m);
      if (m.timings && m.timings.since_request_ms) {
        const t = m.timings.since_request_ms;
        log(`turn ${m.turn}: transcript ${t.transcript ?? "-"} ms, first audio ${t.first_audio ?? "-"} ms after the request${m.cancelled ? ", " + m.cancelled : ""}`);
      }
      $("status").textContent = "listening";
      break;
    case "error":
      if (m.code === "unauthorized" && !m.turn) sessionStorage.removeItem("avatarSession");  // a resume refused: start anew
      stats.errors.push(m.message); log(`error (${m.code}): ${m.message}`, "err"); break;
  }
}

async function start() {
  $("start").disabled = true;
  ctx = new AudioContext();
  await ctx.audioWorklet.addModule("/static/mic-worklet.js");
  const media = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
  });
  const mic = new AudioWorkletNode(ctx, "mic-processor");
  ctx.createMediaStreamSource(media).connect(mic);
  // a short-lived token for this page's origin, offered as a WebSocket subprotocol
  const grant = await fetch("/access-token", { method: "POST" });
  if (!grant.ok) throw new Error("no access token: " + (await grant.json()).message);
  const { protocols } = await grant.json();
  ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws", protocols);
  ws.binaryType = "arraybuffer";
  ws.onmessage = onMessage;
  ws.onclose = (e) => {
    // 4xxx: the gateway's refusals; 1013: busy (the machine's capacity), try again later
    const said = e.code >= 4000 || e.code === 1013;
    $("status").textContent = "disconnected" + (said ? ` (${e.code}: ${e.reason})` : "");
    $("start").disabled = false;
  };
  mic.port.onmessage = (e) => {
    if (!ws || ws.readyState !== 1) return;
    const frame = new Uint8Array(1 + e.data.byteLength);
    frame[0] = 1;
    frame.set(new Uint8Array(e.data.buffer), 1);
    ws.send(frame);
  };
  for (const id of ["interrupt", "text"]) $(id).disabled = false;
  document.querySelector("#say button").disabled = false;
}

$("start").onclick = () => start().catch((e) => { stats.errors.push(String(e)); log(String(e), "err"); });
$("interrupt").onclick = () => send({ type: "interrupt" });
$("say").onsubmit = (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (text) { send({ type: "text", text }); log("you: " + text, "user"); $("text").value = ""; }
};
for (const id of ["emotion", "intensity", "alpha", "fps", "silence", "persona", "persona-preset"]) $(id).onchange = sendControls;
$("face-style").onchange = () => setFace($("face-style").value);
loadPortrait().catch((e) => { portraitFailed(e); log("face: cartoon (" + stats.portraitError + ")"); });
requestAnimationFrame(draw);

// Test hook (tests/test_portrait_page.py): hold the face at `values` ({name: value}: ARKit
// weights and headYaw/Pitch/Roll; null lets the reply drive it again), draw it now and
// return the shown canvas as a PNG data URL (read in the same task: WebGL keeps no copy).
window.faceTest = (values) => {
  held = values;
  drawFace(held ? (n) => held[n] || 0 : () => 0, true);
  return (stats.face === "portrait" ? $("portrait") : $("face")).toDataURL("image/png");
};
