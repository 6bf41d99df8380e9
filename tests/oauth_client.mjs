// oauth_client.mjs SDK_DIR MCP_URL CALLBACK — the MCP TypeScript SDK's own OAuth client, headless.
// It connects to MCP_URL, is told 401, reads both metadata documents, registers itself, and
// prints {"authorize": URL} (where a browser would go). The test approves the request as a
// person and writes the code it got back on stdin; the client then redeems it (PKCE), connects
// with the access token, calls get_project_context, and prints {"ok": …} with what it saw.
import { pathToFileURL } from "node:url";
import readline from "node:readline";

const [sdk, url, callback] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(`${sdk}/dist/esm/${p}`).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");
const { UnauthorizedError } = await load("client/auth.js");

const kept = {};
const provider = {
  get redirectUrl() { return callback; },
  get clientMetadata() {
    return { client_name: "MCP TypeScript SDK (tests)", redirect_uris: [callback], token_endpoint_auth_method: "none",
      grant_types: ["authorization_code", "refresh_token"], response_types: ["code"] };
  },
  clientInformation: () => kept.client,
  saveClientInformation: (c) => { kept.client = c; },
  tokens: () => kept.tokens,
  saveTokens: (t) => { kept.tokens = t; },
  redirectToAuthorization: (u) => { console.log(JSON.stringify({ authorize: u.toString() })); },
  saveCodeVerifier: (v) => { kept.verifier = v; },
  codeVerifier: () => kept.verifier,
};

const first = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
try {
  await new Client({ name: "ts-sdk-oauth", version: "1" }).connect(first);
  console.log(JSON.stringify({ error: "connected without signing in" }));
  process.exit(1);
} catch (err) {
  if (!(err instanceof UnauthorizedError)) throw err;
}
const code = await new Promise((done) => readline.createInterface({ input: process.stdin }).once("line", done));
await first.finishAuth(code.trim());
const client = new Client({ name: "ts-sdk-oauth", version: "1" });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider }));
const out = await client.callTool({ name: "get_project_context", arguments: { project: "website-v2" } });
console.log(JSON.stringify({ ok: out.structuredContent?.project?.slug, client_id: kept.client.client_id,
  token_kind: kept.tokens.access_token.slice(0, 7), refresh: Boolean(kept.tokens.refresh_token) }));
await client.close();
process.exit(0);
