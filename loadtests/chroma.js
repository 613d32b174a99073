// k6: a Chroma query mix or add mix at a constant arrival rate, against BASE (Chroma itself, or
// Lethe's /chroma route). Run by run.sh, which compares direct and through-Lethe in one run.
//
// env: BASE (e.g. http://127.0.0.1:8000 or http://127.0.0.1:7400/chroma), COLLECTION (UUID),
//      MIX (query|add), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe), BODY_BYTES,
//      PAD (pad queries to BODY_BYTES; only for the fast stand-in).
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.BASE;
const COLLECTION = __ENV.COLLECTION;
const MIX = __ENV.MIX || 'query';
const RATE = parseInt(__ENV.RATE || '500');
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
const PATH = `${BASE}/api/v2/tenants/default_tenant/databases/default_database/collections/${COLLECTION}`;

export const options = {
  discardResponseBodies: true,
  scenarios: {
    mix: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: __ENV.DURATION || '20s',
      preAllocatedVUs: 64,
      maxVUs: 256,
    },
  },
  summaryTrendStats: ['avg', 'p(50)', 'p(90)', 'p(99)', 'max'],
};

const headers = { 'Content-Type': 'application/json' };
if (__ENV.TOKEN) {
  headers['Authorization'] = `Bearer ${__ENV.TOKEN}`;
  headers['X-Lethe-Purpose'] = 'personalization';
  headers['X-Lethe-Category'] = 'preference';
}

const embedding = Array.from({ length: 16 }, (_, i) => i / 16);

// About `bytes` of words drawn from 100 000 (a memory's prose, as derivative lineage reads it):
// one seed, one text (mulberry32, in 32-bit integer arithmetic so that no two seeds collide),
// so that no two texts share a run of 12 words.
function prose(bytes, seed) {
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
// A ~BODY_BYTES request: one record whose document fills the body.
const size = Math.max(0, BODY_BYTES - 400);
// Every run's own texts (k6 counts its VUs and iterations from the start in each run): a run
// never writes what an earlier one did.
const salt = Array.from(__ENV.SALT || '').reduce((h, c) => (Math.imul(h, 31) + c.charCodeAt(0)) | 0, 17) * 65537;
const padding = prose(size, 1);

export default function () {
  let res;
  if (MIX === 'add') {
    const id = `load-${__VU}-${__ITER}-${Date.now()}`;
    const document = prose(size, (salt + __VU * 1000003 + __ITER) | 0);
    const body = JSON.stringify({ ids: [id], embeddings: [embedding], documents: [document], metadatas: [{ n: __ITER }] });
    res = http.post(`${PATH}/add`, body, { headers });
  } else {
    const query = { query_embeddings: [embedding], n_results: 5, include: ['documents', 'metadatas', 'distances'] };
    // The fast stand-in ignores the body, so the query can carry the same ~2 KB as an add.
    if (__ENV.PAD) query.pad = padding;
    const body = JSON.stringify(query);
    res = http.post(`${PATH}/query`, body, { headers });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
