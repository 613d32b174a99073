// A real OpenID provider for the tests (the npm package oidc-provider, certified), with the
// people and groups an organisation's directory would give it.
//   node provider.mjs PORT REDIRECT_URI PEOPLE_JSON [JWKS_JSON]
// PEOPLE_JSON (id -> name, email, groups) is read at every sign-in: a test changes someone's
// groups there as a directory would. JWKS_JSON holds the provider's private signing keys (else
// the package's development keys): a test that holds them can sign as the issuer.
// Besides the console's client, `lethe-cli` is a public client for `lethe login` (device
// authorization grant, or a code flow to a loopback redirect, with refresh tokens); its access
// tokens are JWTs for the resource API (`aud` = API), carrying the person's groups, name and amr.
// Signing out at the provider signs the person out of Lethe too (back-channel logout, to the
// redirect URI's sibling /console/oidc/backchannel-logout).
// Prints "ready" once it listens. Its login page takes any password (devInteractions).
import { readFileSync } from 'node:fs';

import Provider from 'oidc-provider';

const [port, redirect, peopleFile, jwksFile] = process.argv.slice(2);
const API = 'urn:lethe:api';
const person = (id) => JSON.parse(readFileSync(peopleFile, 'utf8'))[id];

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

const cli = {
  client_id: 'lethe-cli',
  application_type: 'native',
  token_endpoint_auth_method: 'none',
  // A native client's loopback redirect takes any port (RFC 8252).
  redirect_uris: ['http://127.0.0.1/callback'],
  grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'authorization_code', 'refresh_token'],
  response_types: ['code'],
};

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [client('lethe-console', 'console-secret'), cli],
  ...(jwksFile ? { jwks: JSON.parse(readFileSync(jwksFile, 'utf8')) } : {}),
  async findAccount(_ctx, id) {
    const known = person(id);
    if (!known) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...known }; } };
  },
  claims: { openid: ['sub', 'amr'], profile: ['name'], email: ['email'], groups: ['groups'] },
  scopes: ['openid', 'profile', 'email', 'groups', 'offline_access', 'lethe'],
  // Access tokens for Lethe's API, as an IdP's access token for an API carries groups.
  async extraTokenClaims(_ctx, token) {
    const known = token.accountId && person(token.accountId);
    if (!known) return undefined;
    return { groups: known.groups, name: known.name, ...(known.amr ? { amr: known.amr } : {}) };
  },
  async issueRefreshToken(_ctx, client) {
    return client.grantTypeAllowed('refresh_token');
  },
  // The claims asked for by scope go in the ID token too, as Entra ID and Keycloak put groups.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  cookies: { keys: ['test-only-cookie-key'] },
  features: {
    devInteractions: { enabled: true },
    backchannelLogout: { enabled: true },
    deviceFlow: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (_ctx, client) => (client.clientId === 'lethe-cli' ? API : undefined),
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, resource) => ({
        scope: 'lethe',
        audience: resource,
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
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
    const known = person(result.login.accountId);
    if (known?.amr) result.login.amr = known.amr;
  }
  return finished(req, res, result, options);
};
for (const event of ['backchannel.error', 'backchannel.success', 'end_session.error']) {
  const name = event;
  provider.on(name, (...args) => console.log(name, ...args.filter((a) => a instanceof Error || typeof a === 'string').map(String)));
}
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
