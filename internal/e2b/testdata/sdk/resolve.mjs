// Preloaded (node --import) by the domain-mode run: names under
// $HUTCH_TEST_DOMAIN resolve to 127.0.0.1, where the Go test's TLS front
// listens on 443, as a wildcard DNS record would in a real deployment.
import dns from 'node:dns'
const orig = dns.lookup
dns.lookup = function (host, opts, cb) {
  if (typeof opts === 'function') { cb = opts; opts = {} }
  if (host.endsWith('.' + process.env.HUTCH_TEST_DOMAIN)) {
    if (opts && opts.all) return process.nextTick(cb, null, [{ address: '127.0.0.1', family: 4 }])
    return process.nextTick(cb, null, '127.0.0.1', 4)
  }
  return orig.call(this, host, opts, cb)
}
