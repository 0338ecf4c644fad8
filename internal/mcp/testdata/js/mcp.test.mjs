// hutch's MCP server driven by the official TypeScript client, over stdio
// (spawning `hutch mcp`) and streamable HTTP (the daemon's /mcp). Run by
// TestTypeScriptClient in internal/mcp, which starts `hutch serve` and sets:
//   HUTCH_BIN      the hutch binary
//   HUTCH_SOCKET   the daemon's unix socket
//   HUTCH_MCP_URL  http://127.0.0.1:PORT/mcp
//   HUTCH_KEY_A, HUTCH_KEY_B  API keys of two tenants
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this from the Go test TestTypeScriptClient`);
  return v;
};

const specs = JSON.parse(readFileSync(new URL('../tools.json', import.meta.url), 'utf8'));

async function stdioClient() {
  const client = new Client({ name: 'hutch-ts-test', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: env('HUTCH_BIN'),
    args: ['mcp', '--host', 'unix://' + env('HUTCH_SOCKET')],
    stderr: 'inherit',
  }));
  return client;
}

async function httpClient(key) {
  const client = new Client({ name: 'hutch-ts-test', version: '1.0.0' });
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(env('HUTCH_MCP_URL')), { requestInit: { headers } }));
  return client;
}

// call calls a tool that must succeed and returns its structured result.
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(!res.isError, `${name}: ${res.content?.[0]?.text}`);
  // The text is the same JSON, for clients that read only text.
  assert.deepEqual(JSON.parse(res.content[0].text), res.structuredContent);
  return res.structuredContent;
}

// callErr calls a tool that must fail as a tool error and returns its text.
async function callErr(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  assert.ok(res.isError, `${name} succeeded: ${JSON.stringify(res.structuredContent)}`);
  return res.content[0].text;
}

async function checkTools(client) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), Object.keys(specs).sort());
  for (const tool of tools) {
    const spec = specs[tool.name];
    const s = tool.inputSchema;
    assert.equal(s.type, 'object', tool.name);
    assert.equal(s.additionalProperties, false, `${tool.name}: closed schema`);
    assert.deepEqual([...(s.required ?? [])].sort(), [...spec.required].sort(), `${tool.name}: required`);
    assert.deepEqual(Object.keys(s.properties ?? {}).sort(), [...spec.required, ...spec.optional].sort(), `${tool.name}: properties`);
    for (const [p, ps] of Object.entries(s.properties ?? {})) assert.ok(ps.description, `${tool.name}.${p}: description`);
    assert.ok(tool.outputSchema, `${tool.name}: output schema`);
  }
}

async function scenario(client) {
  await checkTools(client);
  const sb = await call(client, 'create_sandbox', { env: { BASE: 'yes' }, labels: { by: 'ts' } });
  assert.equal(sb.state, 'running');
  const id = sb.id;
  try {
    let r = await call(client, 'run_command', {
      sandbox_id: id, cmd: 'echo $FOO $BASE; pwd; echo oops >&2; exit 3', env: { FOO: 'bar' }, cwd: '/tmp',
    });
    assert.deepEqual([r.stdout, r.stderr, r.exit_code, r.timed_out], ['bar yes\n/tmp\n', 'oops\n', 3, false]);
    r = await call(client, 'run_command', { sandbox_id: id, cmd: 'echo before; sleep 30', timeout_seconds: 0.5 });
    assert.deepEqual([r.stdout, r.exit_code, r.timed_out], ['before\n', null, true]);

    await call(client, 'write_file', { sandbox_id: id, path: 'src/main.py', content: 'print(42)\n' });
    const f = await call(client, 'read_file', { sandbox_id: id, path: '/workspace/src/main.py' });
    assert.deepEqual([f.content, f.encoding], ['print(42)\n', 'utf-8']);
    const l = await call(client, 'list_files', { sandbox_id: id, path: 'src' });
    assert.deepEqual(l.files.map((e) => [e.name, e.type]), [['main.py', 'file']]);
    const rr = await client.readResource({ uri: `hutch://sandboxes/${id}/files/workspace/src/main.py` });
    assert.equal(rr.contents[0].text, 'print(42)\n');
    await call(client, 'remove_file', { sandbox_id: id, path: 'src', recursive: true });
    assert.match(await callErr(client, 'read_file', { sandbox_id: id, path: 'src/main.py' }), /^not_found: /);

    const p = await call(client, 'start_process', { sandbox_id: id, cmd: 'echo started; sleep 300', tag: 'srv' });
    assert.ok(p.process_id && p.pid > 0);
    let out = { stdout: '', next_seq: 0 };
    for (let i = 0; i < 100 && !out.stdout.includes('started'); i++) {
      out = await call(client, 'read_process_output', { sandbox_id: id, process_id: 'srv', from_seq: 0 });
      assert.equal(out.running, true);
      if (!out.stdout) await new Promise((res) => setTimeout(res, 50));
    }
    assert.equal(out.stdout, 'started\n');
    await call(client, 'kill_process', { sandbox_id: id, process_id: p.process_id, signal: 'TERM' });
    const end = await call(client, 'read_process_output', {
      sandbox_id: id, process_id: p.process_id, from_seq: out.next_seq, wait_seconds: 10,
    });
    assert.deepEqual([end.running, end.signal, end.stdout], [false, 'SIGTERM', '']);

    assert.match(await callErr(client, 'run_command', { sandbox_id: 'no-such-sandbox', cmd: 'true' }), /^not_found: /);
    assert.match(await callErr(client, 'run_command', { sandbox_id: id }), /^invalid_argument: /);
  } finally {
    const d = await call(client, 'destroy_sandbox', { sandbox_id: id });
    assert.equal(d.destroyed, true);
  }
}

test('stdio: hutch mcp', async () => {
  const client = await stdioClient();
  try {
    await scenario(client);
  } finally {
    await client.close();
  }
});

test('streamable HTTP: /mcp with an API key', async () => {
  const client = await httpClient(env('HUTCH_KEY_A'));
  try {
    await scenario(client);
  } finally {
    await client.close();
  }
});

test('streamable HTTP: tenants are isolated', async () => {
  const a = await httpClient(env('HUTCH_KEY_A'));
  const b = await httpClient(env('HUTCH_KEY_B'));
  try {
    const sa = await call(a, 'create_sandbox', {});
    const sb = await call(b, 'create_sandbox', {});
    await call(a, 'write_file', { sandbox_id: sa.id, path: 'secret', content: 'a' });
    const listed = async (c) => (await call(c, 'list_sandboxes', { state: 'running' })).sandboxes.map((s) => s.id);
    assert.deepEqual(await listed(a), [sa.id]);
    assert.deepEqual(await listed(b), [sb.id]);
    for (const [tool, args] of [
      ['run_command', { sandbox_id: sa.id, cmd: 'true' }],
      ['read_file', { sandbox_id: sa.id, path: 'secret' }],
      ['list_files', { sandbox_id: sa.id }],
      ['destroy_sandbox', { sandbox_id: sa.id }],
    ]) {
      assert.match(await callErr(b, tool, args), /^not_found: /, `b ${tool} on a's sandbox`);
    }
    await assert.rejects(b.readResource({ uri: `hutch://sandboxes/${sa.id}/files/workspace/secret` }));
    assert.equal((await call(a, 'read_file', { sandbox_id: sa.id, path: 'secret' })).content, 'a');
    await call(a, 'destroy_sandbox', { sandbox_id: sa.id });
    await call(b, 'destroy_sandbox', { sandbox_id: sb.id });
  } finally {
    await a.close();
    await b.close();
  }
});

test('streamable HTTP: no API key, no access', async () => {
  await assert.rejects(httpClient(undefined));
});
