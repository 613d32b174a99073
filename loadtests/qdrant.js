// k6: a Qdrant query mix or upsert mix at a constant arrival rate, against BASE (Qdrant itself, or
// Lethe's /qdrant route). Run by loadtests/bench.
//
// env: BASE (e.g. http://127.0.0.1:6333 or http://127.0.0.1:7400/qdrant), COLLECTION, MIX
//      (query|upsert), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe), BODY_BYTES.
import http from 'k6/http';
import { check } from 'k6';
import { arrivals, fresh, headers, uuid } from './lib.js';

const MIX = __ENV.MIX || 'query';
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
const PATH = `${__ENV.BASE}/collections/${__ENV.COLLECTION}/points`;

export const options = arrivals(500);
const sent = headers('personalization', 'preference');
const vector = Array.from({ length: 16 }, (_, i) => i / 16);
// A ~BODY_BYTES request: one point whose payload text fills the body.
const size = Math.max(0, BODY_BYTES - 400);

export default function () {
  let res;
  if (MIX === 'upsert') {
    const body = JSON.stringify({ points: [{ id: uuid(), vector, payload: { text: fresh(size), n: __ITER } }] });
    res = http.put(`${PATH}?wait=true`, body, { headers: sent });
  } else {
    const body = JSON.stringify({ query: vector, limit: 5, with_payload: true });
    res = http.post(`${PATH}/query`, body, { headers: sent });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
