// TideMQ console script: live charts (poll /api/counters every 2 s and draw each series' rate
// of change per second on the page's <canvas data-kind data-name>) and local-time fields
// (localTimes, below). No library, no build step.
"use strict";

const POLL_MS = 2000;
const POINTS_MAX = 60; // two minutes of history at one point per poll
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

function startChart(canvas) {
  const url = "/api/counters?kind=" + encodeURIComponent(canvas.dataset.kind) +
    "&name=" + encodeURIComponent(canvas.dataset.name);
  const rates = {}; // series name -> [rate, ...]
  let last = null; // previous answer: {t, series}

  async function poll() {
    try {
      const answer = await (await fetch(url, {cache: "no-store"})).json();
      if (answer.series) {
        if (last !== null && answer.t > last.t) {
          const seconds = (answer.t - last.t) / 1000;
          for (const [name, value] of Object.entries(answer.series)) {
            const before = last.series[name];
            const rate = before === undefined ? 0 : Math.max(0, (value - before) / seconds);
            (rates[name] = rates[name] || []).push(rate);
            if (rates[name].length > POINTS_MAX) rates[name].shift();
          }
        }
        last = answer;
        draw(canvas, rates);
        // How many points are drawn: lets a test (or a curious user) see the chart is live.
        canvas.dataset.points = String(Math.max(0, ...Object.values(rates).map((r) => r.length)));
      }
    } catch (error) {
      // The next poll tries again: a console restart or a slow broker is not a page error.
    }
    setTimeout(poll, POLL_MS);
  }
  draw(canvas, rates);
  poll();
}

function niceMax(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function draw(canvas, rates) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, left = 56, bottom = 18, top = 8;
  ctx.clearRect(0, 0, w, h);
  const all = Object.values(rates).flat();
  const max = niceMax(all.length ? Math.max(...all) : 0);
  ctx.font = "11px sans-serif";
  ctx.strokeStyle = "#d9dee5";
  ctx.fillStyle = "#667";
  for (let i = 0; i <= 4; i++) {
    const y = top + (h - top - bottom) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(formatRate(max * i / 4), 4, y + 4);
  }
  const x = (i) => left + (w - left - 4) * i / (POINTS_MAX - 1);
  const y = (v) => top + (h - top - bottom) * (1 - v / max);
  let legend = left;
  Object.entries(rates).forEach(([name, points], n) => {
    const color = COLORS[n % COLORS.length];
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    const offset = POINTS_MAX - points.length;
    points.forEach((v, i) => i ? ctx.lineTo(x(offset + i), y(v)) : ctx.moveTo(x(offset + i), y(v)));
    ctx.stroke(); ctx.lineWidth = 1;
    if (points.length === 1) { // one rate so far: a dot until the next poll makes a line
      ctx.fillStyle = color; ctx.beginPath();
      ctx.arc(x(offset), y(points[0]), 3, 0, 2 * Math.PI); ctx.fill();
    }
    const label = name + " " + formatRate(points.length ? points[points.length - 1] : 0) + "/s";
    ctx.fillStyle = color; ctx.fillText(label, legend, h - 4);
    legend += ctx.measureText(label).width + 16;
  });
  if (!Object.keys(rates).length) { ctx.fillStyle = "#667"; ctx.fillText("waiting for data…", left + 8, h / 2); }
}

function formatRate(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}

// Time fields: <input type="datetime-local" data-ms-field=NAME> is the person's local time; on
// submit the epoch ms it stands for goes into the form's hidden field NAME, which the server
// prefers. Without this script the hidden field stays empty and the server reads UTC.
function localTimes() {
  const offsetMin = -new Date().getTimezoneOffset();
  const sign = offsetMin < 0 ? "-" : "+";
  const hhmm = String(Math.floor(Math.abs(offsetMin) / 60)).padStart(2, "0") + ":" +
    String(Math.abs(offsetMin) % 60).padStart(2, "0");
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  document.querySelectorAll("[data-local-label]").forEach((label) => {
    label.textContent = "(your local time, " + zone + ", UTC" + sign + hhmm + ")";
  });
  document.querySelectorAll("form").forEach((form) => {
    if (!form.querySelector("input[data-ms-field]")) return;
    form.addEventListener("submit", () => {
      form.querySelectorAll("input[data-ms-field]").forEach((input) => {
        const hidden = form.querySelector(
          'input[type="hidden"][name="' + input.dataset.msField + '"]');
        if (!hidden) return;
        // new Date("YYYY-MM-DDTHH:MM[:SS]") without an offset is local time (ECMAScript).
        const ms = input.value ? new Date(input.value).getTime() : NaN;
        hidden.value = Number.isFinite(ms) ? String(ms) : "";
      });
    });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes();
  document.querySelectorAll("figure.chart canvas").forEach(startChart);
});
