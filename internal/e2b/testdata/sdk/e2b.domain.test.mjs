// The e2b SDK in domain mode: only E2B_DOMAIN and E2B_API_KEY are set, so it
// speaks HTTPS to api.<domain> and to 49983-<id>.<domain> (envd), which the
// Go test routes to a real `hutch serve --domain` through a TLS front.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

test('domain mode: create, commands, files, host names, kill', async () => {
  assert.equal(process.env.E2B_API_URL ?? '', '')
  assert.equal(process.env.E2B_SANDBOX_URL ?? '', '')
  const sbx = await Sandbox.create({ metadata: { mode: 'domain' } })
  try {
    assert.equal(sbx.getHost(8080), `8080-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`)
    const r = await sbx.commands.run('echo $((6*7)) && pwd', { cwd: '/tmp' })
    assert.equal(r.stdout, '42\n/tmp\n')
    await sbx.files.write('dm/a.txt', 'over https')
    assert.equal(await sbx.files.read('dm/a.txt'), 'over https')
    const entries = await sbx.files.list('dm')
    assert.deepEqual(entries.map((e) => e.name), ['a.txt'])
    const listed = await Sandbox.list({ query: { metadata: { mode: 'domain' } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  } finally {
    await sbx.kill()
  }
  assert.equal((await Sandbox.list({ query: { metadata: { mode: 'domain' } } }).nextItems()).length, 0)
})

// A sandbox's ports are served at <port>-<id>.<domain>: public by default,
// and with allowPublicTraffic: false only with its trafficAccessToken.
test('domain mode: ports public by default, private with the traffic token', async () => {
  const serve = (sbx) => sbx.commands.run(
    'mkdir -p /tmp/www && echo hello-from-$HOSTNAME > /tmp/www/index.html && busybox httpd -p 127.0.0.1:8080 -h /tmp/www')
  const open = await Sandbox.create({ metadata: { mode: 'domain-ports' } })
  const closed = await Sandbox.create({ metadata: { mode: 'domain-ports' }, network: { allowPublicTraffic: false } })
  try {
    await serve(open)
    await serve(closed)
    assert.equal(open.trafficAccessToken, undefined)
    const pub = await fetch(`https://${open.getHost(8080)}/index.html`)
    assert.equal(pub.status, 200)
    assert.match(await pub.text(), /^hello-from-/)

    assert.ok(closed.trafficAccessToken, 'a private sandbox has a traffic token')
    const url = `https://${closed.getHost(8080)}/index.html`
    assert.equal((await fetch(url)).status, 401)
    assert.equal((await fetch(url, { headers: { 'e2b-traffic-access-token': 'wrong' } })).status, 403)
    const ok = await fetch(url, { headers: { 'e2b-traffic-access-token': closed.trafficAccessToken } })
    assert.equal(ok.status, 200)
    assert.match(await ok.text(), /^hello-from-/)
  } finally {
    await open.kill()
    await closed.kill()
  }
})
