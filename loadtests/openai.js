// k6: chat completions at a constant arrival rate against BASE (the provider, or Lethe's /openai
// route). MIX=chat: whole answers (their duration is the added latency); MIX=stream: server-sent
// events (their time to the first byte is what a user waits for). Run by loadtests/bench.
//
// env: BASE (e.g. http://127.0.0.1:18080 or http://127.0.0.1:7400/openai), MIX (chat|stream),
//      RATE (requests/s), DURATION (e.g. 20s), TOKEN (for Lethe).
import http from 'k6/http';
import { check } from 'k6';
import { arrivals, headers } from './lib.js';

const MIX = __ENV.MIX || 'chat';

export const options = arrivals(200);
const sent = headers('support', 'conversation');
if (!__ENV.TOKEN) sent.Authorization = 'Bearer sk-load';
// A prompt with some memory in it, about 2 KB.
const messages = [
  { role: 'system', content: 'Known facts: ' + 'likes green tea; lives in Lyon; '.repeat(60) },
  { role: 'user', content: 'What should I drink?' },
];

export default function () {
  const body = JSON.stringify({ model: 'gpt-test', messages, stream: MIX === 'stream' });
  const res = http.post(`${__ENV.BASE}/v1/chat/completions`, body, { headers: sent });
  check(res, { 'status 2xx': (r) => r.status >= 200 && r.status < 300 });
}
