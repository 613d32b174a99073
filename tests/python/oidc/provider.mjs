// A real OpenID provider for the tests (the npm package oidc-provider, certified), with the
// people and groups an organisation's directory would give it.
//   node provider.mjs PORT REDIRECT_URI PEOPLE_JSON
// PEOPLE_JSON (id -> name, email, groups) is read at every sign-in: a test changes someone's
// groups there as a directory would.
// Signing out at the provider signs the person out of Lethe too (back-channel logout, to the
// redirect URI's sibling /console/oidc/backchannel-logout).
// Prints "ready" once it listens. Its login page takes any password (devInteractions).
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const [port, redirect, peopleFile] = process.argv.slice(2);

const backchannel = redirect.replace(/\/callback$/, '/backchannel-logout');

const client = (id, secret) => ({
  client_id: id,
  client_secret: secret,
  redirect_uris: [redirect],
  backchannel_logout_uri: backchannel,
  grant_types: ['authorization_code'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
});

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [client('lethe-console', 'console-secret')],
  async findAccount(_ctx, id) {
    const person = JSON.parse(readFileSync(peopleFile, 'utf8'))[id];
    if (!person) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...person }; } };
  },
  claims: { openid: ['sub', 'amr'], profile: ['name'], email: ['email'], groups: ['groups'] },
  scopes: ['openid', 'profile', 'email', 'groups'],
  // The claims asked for by scope go in the ID token too, as Entra ID and Keycloak put groups.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  cookies: { keys: ['test-only-cookie-key'] },
  features: { devInteractions: { enabled: true }, backchannelLogout: { enabled: true } },
  // Lethe listens on 127.0.0.1 here, which the provider's SSRF protection refuses to call.
  fetch(url, options) {
    delete options.dispatcher;
    return globalThis.fetch(url, options);
  },
});
provider.proxy = false;
// The login page takes any password; the directory says which people also showed a second
// factor (`amr`), as a provider's MFA would put it in the ID token.
const finished = provider.interactionFinished.bind(provider);
provider.interactionFinished = (req, res, result, options) => {
  if (result.login) {
    const person = JSON.parse(readFileSync(peopleFile, 'utf8'))[result.login.accountId];
    if (person?.amr) result.login.amr = person.amr;
  }
  return finished(req, res, result, options);
};
for (const event of ['backchannel.error', 'backchannel.success', 'end_session.error']) {
  const name = event;
  provider.on(name, (...args) => console.log(name, ...args.filter((a) => a instanceof Error || typeof a === 'string').map(String)));
}
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
