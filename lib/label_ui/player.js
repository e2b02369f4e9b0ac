// Clip player of the label page: plays the two clips of a pair in step, at a chosen speed.
//
// Clips are fetched once into blob URLs (so the next pair's clips, prefetched while the person
// watches the current pair, start at once) and set on two <video> elements. Both start together
// from frame 0; when one ends it holds its last frame until the other ends too, then both
// restart: the pair loops in step even when the clips differ in length.
// window.rlhfTiming records, for the benchmark and the browser tests, when a key went down and
// when a new pair was first on screen.
(() => {
  if (window.rlhfPlayer) return;
  const blobs = new Map(); // clip url -> Promise<object url>, least recently used first
  const MAX_BLOBS = 16;
  const timing = { lastKeyAt: null, lastKey: null, shown: [] };
  let seq = 0;
  let rate = 1;
  let paused = false;
  let current = []; // the <video> elements on show

  document.addEventListener('keydown', (e) => {
    timing.lastKeyAt = performance.now();
    timing.lastKey = e.key;
  }, true);

  function load(url) {
    let p = blobs.get(url);
    if (p) {
      blobs.delete(url); // move to the end: recently used
    } else {
      p = fetch(url, { credentials: 'same-origin' })
        .then((r) => { if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`); return r.blob(); })
        .then((b) => URL.createObjectURL(b));
      p.catch(() => blobs.delete(url));
    }
    blobs.set(url, p);
    while (blobs.size > MAX_BLOBS) {
      const [oldest, op] = blobs.entries().next().value;
      blobs.delete(oldest);
      op.then((u) => setTimeout(() => URL.revokeObjectURL(u), 10000), () => {});
    }
    return p;
  }

  function restartAll() {
    current.forEach((v) => { v.currentTime = 0; v.dataset.ended = ''; });
    if (!paused) current.forEach((v) => v.play().catch(() => {}));
  }

  function attach(v) {
    if (v.dataset.rlhf) return;
    v.dataset.rlhf = '1';
    v.muted = true;
    v.playsInline = true;
    v.loop = false;
    v.addEventListener('ended', () => {
      v.dataset.ended = '1';
      if (current.includes(v) && current.every((w) => w.dataset.ended === '1')) restartAll();
    });
  }

  function ready(v, src) {
    return new Promise((resolve) => {
      if (v.dataset.src === src && v.readyState >= 2) { resolve(); return; }
      const done = () => { v.removeEventListener('loadeddata', done); v.removeEventListener('error', done); resolve(); };
      v.addEventListener('loadeddata', done);
      v.addEventListener('error', done);
      v.dataset.src = src;
      v.src = src;
    });
  }

  async function show(ids, urls) {
    const my = ++seq;
    const calledAt = performance.now();
    const vids = ids.map((id) => document.getElementById(id));
    if (vids.some((v) => !v)) return false;
    vids.forEach(attach);
    let srcs;
    try {
      srcs = await Promise.all(urls.map(load));
    } catch (err) {
      console.warn('clip failed to load', err);
      return false;
    }
    if (my !== seq) return false;
    current.forEach((v) => { if (!vids.includes(v)) v.pause(); });
    current = vids;
    await Promise.all(vids.map((v, i) => ready(v, srcs[i])));
    if (my !== seq) return false;
    vids.forEach((v) => { v.playbackRate = rate; });
    restartAll();
    requestAnimationFrame(() => {
      timing.shown.push({ seq: my, at: performance.now(), calledAt, keyAt: timing.lastKeyAt, key: timing.lastKey, urls });
      if (timing.shown.length > 1000) timing.shown.shift();
    });
    return true;
  }

  function prefetch(urls) { urls.forEach((u) => load(u).catch(() => {})); }

  function setRate(r) {
    rate = r;
    current.forEach((v) => { v.playbackRate = r; });
  }

  function setPaused(p) {
    paused = p;
    if (p) current.forEach((v) => v.pause());
    else current.forEach((v) => { if (v.dataset.ended !== '1') v.play().catch(() => {}); });
    if (!p && current.length && current.every((w) => w.dataset.ended === '1')) restartAll();
  }

  function stop() {
    seq++;
    current.forEach((v) => v.pause());
    current = [];
  }

  // The reward model's plot under each clip (label page with --reward): a cursor at the frame
  // on show, moved every animation frame.
  function moveCursors() {
    document.querySelectorAll('svg[data-plot-for]').forEach((svg) => {
      const v = document.getElementById(svg.dataset.plotFor);
      const cursor = svg.querySelector('.rlhf-cursor');
      if (!v || !cursor || !(v.duration > 0)) return;
      const x = (Math.min(v.currentTime / v.duration, 1) * svg.width.baseVal.value).toFixed(1);
      cursor.setAttribute('x1', x);
      cursor.setAttribute('x2', x);
    });
    requestAnimationFrame(moveCursors);
  }
  requestAnimationFrame(moveCursors);

  window.rlhfTiming = timing;
  window.rlhfPlayer = { show, prefetch, setRate, setPaused, stop };
})();
