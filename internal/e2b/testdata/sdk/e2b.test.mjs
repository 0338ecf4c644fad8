// The e2b SDK, unchanged, against a real `hutch serve`. The Go test that
// runs this file sets E2B_API_URL and E2B_SANDBOX_URL to the daemon's TCP
// address and E2B_API_KEY to a hutch API key: the routing a user sets up.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, ALL_TRAFFIC, CommandExitError, TimeoutError, NotFoundError, FilesystemEventType } from 'e2b'

const run = `run-${process.pid}-${Date.now()}`
const made = []

async function create(opts = {}) {
  const sbx = await Sandbox.create({ metadata: { suite: run }, ...opts })
  made.push(sbx)
  return sbx
}

after(async () => {
  for (const sbx of made) await sbx.kill().catch(() => {})
})

test('create, getInfo and commands.run with env, cwd and exit codes', async () => {
  const sbx = await create({ envs: { FROM_CREATE: 'c' }, timeoutMs: 120_000 })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.suite, run)
  assert.ok(info.endAt > new Date(Date.now() + 100_000), `endAt ${info.endAt}`)

  const r = await sbx.commands.run('echo "$FROM_CREATE $FOO" && pwd && echo err >&2', { envs: { FOO: 'bar' }, cwd: '/tmp' })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'c bar\n/tmp\n')
  assert.equal(r.stderr, 'err\n')

  const chunks = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), '1\n2\n3\n')

  await assert.rejects(sbx.commands.run('echo nope; exit 7'), (err) => {
    assert.ok(err instanceof CommandExitError, String(err))
    assert.equal(err.exitCode, 7)
    assert.equal(err.stdout, 'nope\n')
    return true
  })
})

test('commands: stdin, timeout, background and reconnect, list, kill', async () => {
  const sbx = await create()

  const cat = await sbx.commands.run('cat | tr a-z A-Z', { background: true, stdin: true })
  await cat.sendStdin('hello stdin\n')
  await cat.closeStdin()
  const catDone = await cat.wait()
  assert.equal(catDone.stdout, 'HELLO STDIN\n')

  const started = Date.now()
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }), (err) => {
    assert.ok(err instanceof TimeoutError, String(err))
    return true
  })
  assert.ok(Date.now() - started < 10_000)

  const bg = await sbx.commands.run('sleep 1.5; echo finished', { background: true })
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === bg.pid), JSON.stringify(listed))
  await bg.disconnect()
  const again = await sbx.commands.connect(bg.pid)
  const res = await again.wait()
  assert.equal(res.exitCode, 0)
  assert.match(res.stdout, /finished/)

  const long = await sbx.commands.run('sleep 60', { background: true })
  assert.equal(await sbx.commands.kill(long.pid), true)
  await assert.rejects(long.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(long.pid), false)
})

test('pty: create, input, resize', async () => {
  const sbx = await create()
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
  await sbx.pty.resize(term.pid, { cols: 101, rows: 41 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit 0\n'))
  const res = await term.wait()
  assert.equal(res.exitCode, 0)
  assert.match(out, /41 101/)
})

test('files: write, read, list, exists, rename, remove and watch', async () => {
  const sbx = await create()
  const info = await sbx.files.write('notes/a.txt', 'alpha')
  assert.equal(info.name, 'a.txt')
  assert.equal(await sbx.files.read('notes/a.txt'), 'alpha')
  const bytes = await sbx.files.read('notes/a.txt', { format: 'bytes' })
  assert.deepEqual(Array.from(bytes), Array.from(Buffer.from('alpha')))

  await sbx.files.write([{ path: '/workspace/notes/b.txt', data: 'beta' }, { path: 'notes/deep/c.txt', data: 'gamma' }])
  await sbx.files.write('notes/zipped.txt', 'sent gzipped', { gzip: true })
  assert.equal(await sbx.files.read('notes/zipped.txt', { gzip: true }), 'sent gzipped')
  await sbx.files.remove('notes/zipped.txt')
  const names = (await sbx.files.list('notes')).map((e) => e.name).sort()
  assert.deepEqual(names, ['a.txt', 'b.txt', 'deep'])
  const deep = (await sbx.files.list('notes', { depth: 2 })).map((e) => e.name).sort()
  assert.deepEqual(deep, ['a.txt', 'b.txt', 'c.txt', 'deep'])

  assert.equal(await sbx.files.exists('notes/b.txt'), true)
  assert.equal(await sbx.files.exists('notes/zzz'), false)
  assert.equal(await sbx.files.makeDir('made/here'), true)
  assert.equal(await sbx.files.makeDir('made/here'), false)
  const moved = await sbx.files.rename('notes/b.txt', 'made/here/b.txt')
  assert.equal(moved.path, '/workspace/made/here/b.txt')
  await sbx.files.remove('notes/deep')
  assert.equal(await sbx.files.exists('notes/deep'), false)
  await assert.rejects(sbx.files.read('notes/deep/c.txt'), NotFoundError)

  const seen = []
  let resolve
  const gotWrite = new Promise((r) => { resolve = r })
  const handle = await sbx.files.watchDir('made', (ev) => {
    seen.push(`${ev.type}:${ev.name}`)
    if (ev.type === FilesystemEventType.WRITE && ev.name === 'here/w.txt') resolve()
  }, { recursive: true })
  await sbx.files.write('made/here/w.txt', 'watched')
  await Promise.race([gotWrite, new Promise((_, rej) => setTimeout(() => rej(new Error(`no write event; saw ${seen}`)), 10_000))])
  await handle.stop()
  assert.ok(seen.includes('create:here/w.txt'), seen.join(' '))
})

test('pause and resume keep files; kill ends the sandbox', async () => {
  const sbx = await create()
  await sbx.files.write('keep.txt', 'still here')
  await sbx.commands.run('echo from-shell > /workspace/shell.txt')
  assert.equal(await sbx.pause(), true)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')

  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('keep.txt'), 'still here')
  assert.equal((await back.commands.run('cat /workspace/shell.txt')).stdout, 'from-shell\n')

  await back.setTimeout(90_000)
  const end = (await back.getInfo()).endAt
  assert.ok(end > new Date(Date.now() + 80_000) && end < new Date(Date.now() + 95_000), `endAt ${end}`)

  await back.kill()
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await back.isRunning(), false)
})

test('list with a metadata filter, in pages', async () => {
  const tag = `${run}-list`
  const ids = []
  for (let i = 0; i < 3; i++) ids.push((await create({ metadata: { suite: run, list: tag } })).sandboxId)
  await create({ metadata: { suite: run, list: 'other' } })

  const paginator = Sandbox.list({ query: { metadata: { list: tag } }, limit: 2 })
  const got = []
  while (paginator.hasNext) got.push(...(await paginator.nextItems()))
  assert.deepEqual(got.map((s) => s.sandboxId).sort(), ids.slice().sort())
  assert.ok(got.every((s) => s.metadata.list === tag && s.state === 'running'))

  await Sandbox.pause(ids[0])
  const paused = await Sandbox.list({ query: { metadata: { list: tag }, state: ['paused'] } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [ids[0]])
})

test('unsupported features answer errors, not hangs', async () => {
  await assert.rejects(Sandbox.create({ network: { egressProxy: { address: 'proxy.example:1080' } } }), /not supported/)
  const sbx = await create()
  await assert.rejects(sbx.files.write('m.txt', 'x', { metadata: { a: 'b' } }), /metadata requires envd/i)
  await assert.rejects(Sandbox.create('no-such-template'), /not found|template/i)
})

// The network options become hutch policies; the hutch API (same address,
// same key as a bearer) shows them.
async function hutchPolicy(id) {
  const res = await fetch(`${process.env.E2B_API_URL}/v1/sandboxes/${id}/network`,
    { headers: { authorization: `Bearer ${process.env.E2B_API_KEY}` } })
  assert.equal(res.status, 200)
  return res.json()
}

test('network options: allowInternetAccess, allowOut/denyOut, rules, updateNetwork',
  { skip: !process.env.HUTCH_NETWORKED && 'sandbox networking is not available on this host' }, async () => {
  const closed = await create({ allowInternetAccess: false })
  assert.equal((await hutchPolicy(closed.sandboxId)).mode, 'deny-all')
  assert.equal((await closed.commands.run('ls /sys/class/net')).stdout, 'lo\n')

  const listed = await create({ network: {
    allowOut: ['api.example.com', '203.0.113.0/24'], denyOut: [ALL_TRAFFIC],
    rules: { 'api.example.com': [{ transform: { headers: { Authorization: 'Bearer e2b-secret' } } }] } } })
  const pol = await hutchPolicy(listed.sandboxId)
  assert.equal(pol.mode, 'allow-list')
  assert.deepEqual(pol.allow, [{ host: 'api.example.com' }, { cidr: '203.0.113.0/24' }])
  assert.deepEqual(pol.credentials, [{ host: 'api.example.com', headers: { Authorization: '[redacted]' } }])
  const env = await listed.commands.run('env; ls /sys/class/net')
  assert.match(env.stdout, /eth0/)
  assert.doesNotMatch(env.stdout, /e2b-secret/)

  await listed.updateNetwork({ denyOut: [ALL_TRAFFIC] })
  assert.equal((await hutchPolicy(listed.sandboxId)).mode, 'deny-all')
  await Sandbox.updateNetwork(listed.sandboxId, { denyOut: ['198.51.100.0/24'] })
  const open = await hutchPolicy(listed.sandboxId)
  assert.equal(open.mode, 'allow-all')
  assert.deepEqual(open.deny, ['198.51.100.0/24'])

  const dflt = await create()
  assert.equal((await hutchPolicy(dflt.sandboxId)).mode, 'allow-all', 'an E2B sandbox has the internet by default')
})
