// k6: a Chroma query mix or add mix at a constant arrival rate, against BASE (Chroma itself, the
// fast stand-in, or one of Lethe's routes to them). Run by loadtests/bench.
//
// env: BASE (e.g. http://127.0.0.1:8000 or http://127.0.0.1:7400/chroma), COLLECTION (UUID),
//      MIX (query|add|heartbeat: a GET Lethe passes on as it is, the floor of every route), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe), BODY_BYTES,
//      PAD (pad queries to BODY_BYTES; only for the fast stand-in, which ignores the body),
//      SUBJECTS (each request names one of that many subjects, s-0, s-1, ..., in turn: a token
//      bound to none fills the policy cache).
import http from 'k6/http';
import exec from 'k6/execution';
import { check } from 'k6';
import { arrivals, fresh, headers, prose } from './lib.js';

const MIX = __ENV.MIX || 'query';
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
const PATH = `${__ENV.BASE}/api/v2/tenants/default_tenant/databases/default_database/collections/${__ENV.COLLECTION}`;

export const options = arrivals(500);
const sent = headers('personalization', 'preference');
const embedding = Array.from({ length: 16 }, (_, i) => i / 16);
// A ~BODY_BYTES request: one record whose document fills the body.
const size = Math.max(0, BODY_BYTES - 400);
const padding = prose(size, 1);

export default function () {
  let res;
  if (__ENV.SUBJECTS) sent['X-Lethe-Subject'] = `s-${exec.scenario.iterationInTest % parseInt(__ENV.SUBJECTS)}`;
  if (MIX === 'heartbeat') {
    res = http.get(`${__ENV.BASE}/api/v2/heartbeat`, { headers: sent });
  } else if (MIX === 'add') {
    const id = `load-${__VU}-${__ITER}-${Date.now()}`;
    const body = JSON.stringify({ ids: [id], embeddings: [embedding], documents: [fresh(size)], metadatas: [{ n: __ITER }] });
    res = http.post(`${PATH}/add`, body, { headers: sent });
  } else {
    const query = { query_embeddings: [embedding], n_results: 5, include: ['documents', 'metadatas', 'distances'] };
    if (__ENV.PAD) query.pad = padding;
    res = http.post(`${PATH}/query`, JSON.stringify(query), { headers: sent });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
