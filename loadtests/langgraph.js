// k6: a LangGraph store search mix or put mix at a constant arrival rate, against BASE (the
// LangGraph server itself, or Lethe's /langgraph route). Run by loadtests/bench.
//
// env: BASE (e.g. http://127.0.0.1:2024 or http://127.0.0.1:7400/langgraph), SUBJECT, MIX
//      (search|put), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe), BODY_BYTES.
import http from 'k6/http';
import { check } from 'k6';
import { arrivals, fresh, headers } from './lib.js';

const MIX = __ENV.MIX || 'search';
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
// The route's default namespace: tenant, subject, then the app's own elements.
const namespace = ['acme', __ENV.SUBJECT || 'load-user'];

export const options = arrivals(500);
const sent = headers('personalization', 'preference');
const size = Math.max(0, BODY_BYTES - 300);

export default function () {
  let res;
  if (MIX === 'put') {
    const key = `load-${__VU}-${__ITER}-${Date.now()}`;
    const body = JSON.stringify({ namespace: [...namespace, 'facts'], key, value: { text: fresh(size) } });
    res = http.put(`${__ENV.BASE}/store/items`, body, { headers: sent });
  } else {
    const body = JSON.stringify({ namespace_prefix: namespace, limit: 5 });
    res = http.post(`${__ENV.BASE}/store/items/search`, body, { headers: sent });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
