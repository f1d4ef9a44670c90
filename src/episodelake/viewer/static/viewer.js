// episodelake viewer: the episode page's player (videos in sync, one scrubber, a frame counter) and per-step plots.
// Plain JS and SVG, no libraries. The page's data is the JSON in #episode-data: frames, fps, plots {key: [[channel values]]}.
"use strict";
(function () {
  const source = document.getElementById("episode-data");
  if (!source) return;
  const data = JSON.parse(source.textContent);
  const frames = data.frames, fps = data.fps;
  const videos = Array.from(document.querySelectorAll("video.camera"));
  const scrubber = document.getElementById("scrubber");
  const counter = document.getElementById("frame-counter");
  const play = document.getElementById("play");
  const cursors = [];
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
  const W = 420, H = 140, L = 44, R = 8, T = 18, B = 18;
  const SVG = "http://www.w3.org/2000/svg";
  const x = (i) => L + (frames > 1 ? (i * (W - L - R)) / (frames - 1) : 0);

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function plot(key, channels) {
    let lo = Infinity, hi = -Infinity; // a loop, not Math.min(...values): long episodes overflow the call stack
    for (const series of channels) for (const v of series) if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (lo === Infinity) { lo = 0; hi = 1; }
    if (lo === hi) { lo -= 1; hi += 1; }
    const y = (v) => T + ((hi - v) * (H - T - B)) / (hi - lo);
    const svg = el("svg", { class: "plot", width: W, height: H, "data-key": key });
    el("text", { x: L, y: 12 }, svg).textContent = key + (channels.length > 1 ? ` (${channels.length} channels)` : "");
    el("text", { x: 2, y: T + 8 }, svg).textContent = hi.toPrecision(3);
    el("text", { x: 2, y: H - B }, svg).textContent = lo.toPrecision(3);
    el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#ccc" }, svg);
    channels.forEach((series, c) => {
      const points = series.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
      el("polyline", { points: points.join(" "), fill: "none", stroke: COLORS[c % COLORS.length], "stroke-width": 1.2 }, svg);
    });
    cursors.push(el("line", { class: "cursor", x1: x(0), x2: x(0), y1: T, y2: H - B }, svg));
    document.getElementById("plots").appendChild(svg);
  }

  for (const key in data.plots) plot(key, data.plots[key]);

  let frame = 0, playing = false, timer = null;

  // Show frame i everywhere: counter, scrubber, plot cursors; seek the videos unless they are playing.
  function show(i, seek) {
    frame = Math.max(0, Math.min(frames - 1, i));
    counter.textContent = `frame ${frame + 1} / ${frames}`;
    scrubber.value = frame;
    for (const c of cursors) { c.setAttribute("x1", x(frame)); c.setAttribute("x2", x(frame)); }
    if (seek) for (const v of videos) v.currentTime = (frame + 0.5) / fps;
  }

  function tick() {
    if (!playing) return;
    if (videos.length) {
      const lead = videos[0];
      show(Math.floor(lead.currentTime * fps), false);
      for (const v of videos.slice(1)) if (Math.abs(v.currentTime - lead.currentTime) > 0.5 / fps) v.currentTime = lead.currentTime;
      if (lead.ended) stop();
      else requestAnimationFrame(tick);
    }
  }

  function start() {
    if (frame >= frames - 1) show(0, true);
    playing = true;
    play.textContent = "pause";
    if (videos.length) {
      for (const v of videos) v.play();
      requestAnimationFrame(tick);
    } else {
      timer = setInterval(() => (frame >= frames - 1 ? stop() : show(frame + 1, false)), 1000 / fps);
    }
  }

  function stop() {
    playing = false;
    play.textContent = "play";
    clearInterval(timer);
    for (const v of videos) v.pause();
  }

  play.addEventListener("click", () => (playing ? stop() : start()));
  scrubber.addEventListener("input", () => { stop(); show(Number(scrubber.value), true); });
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT") return;
    if (e.key === "ArrowRight") { stop(); show(frame + 1, true); }
    if (e.key === "ArrowLeft") { stop(); show(frame - 1, true); }
    if (e.key === " ") { e.preventDefault(); playing ? stop() : start(); }
  });
  show(0, false);
})();
