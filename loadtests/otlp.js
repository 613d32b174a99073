// k6: OTLP/HTTP trace exports at a constant arrival rate against BASE (an OTLP receiver, or
// Lethe's otlp route): each one the same protobuf ExportTraceServiceRequest of 50 OpenInference
// LLM spans with ~2 KB of prompt and answer each (BODY_FILE, written by loadtests/bench), as an
// instrumented agent's BatchSpanProcessor sends them. Run by loadtests/bench.
//
// env: BASE, BODY_FILE, RATE (exports/s), DURATION, TOKEN (for Lethe).
import http from 'k6/http';
import { check } from 'k6';
import { arrivals } from './lib.js';

export const options = arrivals(50);
const body = open(__ENV.BODY_FILE, 'b');
const headers = { 'Content-Type': 'application/x-protobuf' };
if (__ENV.TOKEN) headers.Authorization = `Bearer ${__ENV.TOKEN}`;

export default function () {
  const res = http.post(`${__ENV.BASE}/v1/traces`, body, { headers });
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
