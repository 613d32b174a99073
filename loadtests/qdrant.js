// k6: a Qdrant query mix or upsert mix at a constant arrival rate, against BASE (Qdrant itself, or
// Lethe's /qdrant route). Run by qdrant.sh, which compares direct and through-Lethe in one run.
//
// env: BASE (e.g. http://127.0.0.1:6333 or http://127.0.0.1:7400/qdrant), COLLECTION, MIX
//      (query|upsert), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe), BODY_BYTES.
import http from 'k6/http';
import { check } from 'k6';

const BASE = __ENV.BASE;
const COLLECTION = __ENV.COLLECTION;
const MIX = __ENV.MIX || 'query';
const RATE = parseInt(__ENV.RATE || '500');
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
const PATH = `${BASE}/collections/${COLLECTION}/points`;

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

const vector = Array.from({ length: 16 }, (_, i) => i / 16);
// A ~BODY_BYTES request: one point whose payload text fills the body.
const data = 'x'.repeat(Math.max(0, BODY_BYTES - 400));

function uuid() {
  const hex = () => Math.floor(Math.random() * 16).toString(16);
  const part = (n) => Array.from({ length: n }, hex).join('');
  return `${part(8)}-${part(4)}-4${part(3)}-a${part(3)}-${part(12)}`;
}

export default function () {
  let res;
  if (MIX === 'upsert') {
    const body = JSON.stringify({ points: [{ id: uuid(), vector, payload: { data, n: __ITER } }] });
    res = http.put(`${PATH}?wait=true`, body, { headers });
  } else {
    const body = JSON.stringify({ query: vector, limit: 5, with_payload: true });
    res = http.post(`${PATH}/query`, body, { headers });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
