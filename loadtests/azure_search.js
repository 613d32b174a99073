// k6: an Azure AI Search search mix or index mix at a constant arrival rate, against BASE (the
// fast stand-in itself, or Lethe's route to it). Run by loadtests/bench.
//
// env: BASE, MIX (az-search|az-index), RATE (requests/s), DURATION (e.g. 20s), TOKEN (for
//      Lethe), BODY_BYTES.
import http from 'k6/http';
import { check } from 'k6';
import { arrivals, fresh, headers, uuid } from './lib.js';

const MIX = __ENV.MIX || 'az-search';
const BODY_BYTES = parseInt(__ENV.BODY_BYTES || '2048');
const DOCS = `${__ENV.BASE}/indexes('bench')/docs`;
const VERSION = 'api-version=2026-04-01';

export const options = arrivals(500);
const sent = headers('personalization', 'preference');
// A ~BODY_BYTES request: one document whose text fills the body.
const size = Math.max(0, BODY_BYTES - 200);

export default function () {
  let res;
  if (MIX === 'az-index') {
    const body = JSON.stringify({ value: [{ '@search.action': 'mergeOrUpload', id: uuid(), text: fresh(size) }] });
    res = http.post(`${DOCS}/search.index?${VERSION}`, body, { headers: sent });
  } else {
    const body = JSON.stringify({ search: 'trip', filter: "text ne 'x'", top: 5 });
    res = http.post(`${DOCS}/search.post.search?${VERSION}`, body, { headers: sent });
  }
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
