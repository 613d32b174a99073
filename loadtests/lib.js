// Shared by the k6 scripts: the constant-arrival-rate scenario, Lethe's headers, and prose.

// RATE requests/s for DURATION, whatever the latency (k6's constant arrival rate); or, with
// VUS set, that many clients sending one request after another for DURATION (as many requests
// as the server can take: its saturation throughput); with ITERATIONS set, that many requests
// in all, sent by VUS (default 32) clients as fast as they are answered.
export function arrivals(defaultRate) {
  const duration = __ENV.DURATION || '20s';
  const vus = parseInt(__ENV.VUS || '32');
  const mix = __ENV.ITERATIONS
    ? { executor: 'shared-iterations', vus, iterations: parseInt(__ENV.ITERATIONS), maxDuration: '10m' }
    : __ENV.VUS
    ? { executor: 'constant-vus', vus, duration }
    : {
        executor: 'constant-arrival-rate',
        rate: parseInt(__ENV.RATE || `${defaultRate}`),
        timeUnit: '1s',
        duration,
        preAllocatedVUs: 64,
        maxVUs: parseInt(__ENV.MAX_VUS || '512'),
      };
  return {
    discardResponseBodies: true,
    scenarios: { mix },
    summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'],
  };
}

// JSON headers, and through Lethe (TOKEN set) the agent's token and the purpose and category.
export function headers(purpose, category) {
  const h = { 'Content-Type': 'application/json' };
  if (__ENV.TOKEN) {
    h['Authorization'] = `Bearer ${__ENV.TOKEN}`;
    h['X-Lethe-Purpose'] = purpose;
    h['X-Lethe-Category'] = category;
  }
  return h;
}

// About `bytes` of words drawn from 100 000 (a memory's prose, as derivative lineage reads it):
// one seed, one text (mulberry32, in 32-bit integer arithmetic so that no two seeds collide),
// so that no two texts share a run of 12 words.
export function prose(bytes, seed) {
  const words = [];
  let state = seed | 0;
  for (let length = 0; length < bytes; ) {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    const word = `w${((t ^ (t >>> 14)) >>> 0) % 100000}`;
    words.push(word);
    length += word.length + 1;
  }
  return words.join(' ');
}

// Every run's own texts (k6 counts its VUs and iterations from the start in each run): a run
// never writes what an earlier one did.
export const salt =
  Array.from(__ENV.SALT || '').reduce((h, c) => (Math.imul(h, 31) + c.charCodeAt(0)) | 0, 17) * 65537;

// This iteration's own text of about `bytes`.
export function fresh(bytes) {
  return prose(bytes, (salt + __VU * 1000003 + __ITER) | 0);
}

export function uuid() {
  const hex = () => Math.floor(Math.random() * 16).toString(16);
  const part = (n) => Array.from({ length: n }, hex).join('');
  return `${part(8)}-${part(4)}-4${part(3)}-a${part(3)}-${part(12)}`;
}
