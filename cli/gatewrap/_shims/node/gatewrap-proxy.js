'use strict';
// gatewrap's Node shim, preloaded into every Node agent with NODE_OPTIONS=--require <this file>.
//
// Node before 22.21 / 24.5 ignores HTTP_PROXY/HTTPS_PROXY. On those versions this file
// routes, through the gate named by the proxy variables and with Node's own modules only:
//   - global fetch (Node's bundled undici): its global dispatcher, undici's Agent found at
//     globalThis[Symbol.for('undici.globalDispatcher.1')], is replaced on the first fetch by an
//     Agent of the same class whose `connect` opens a CONNECT tunnel (RFC 9110 section 9.3.6);
//   - http.request/get: the global agent sends absolute-form requests to the gate
//     (RFC 9112 section 3.2.2); https.request/get: the global agent's connections are
//     CONNECT tunnels, with TLS to the destination on top.
// Hosts in NO_PROXY (localhost) are dialled directly. With NODE_USE_ENV_PROXY on a Node that
// honours it, routing is left to Node. On every version, a connect(2) the kernel refuses with
// EPERM (gatewrap's cgroup hooks) gets a message that names gatewrap, the destination and what
// to do; its code, errno and syscall stay as they were.

const http = require('node:http');
const https = require('node:https');
const net = require('node:net');
const tls = require('node:tls');

const env = process.env;
const GATE = env.GATEWRAP_GATE || 'the gate';
const RUN = env.GATEWRAP_RUN || '';
// The command that shows the run's records (`gatewrap audit --run ID [--log PATH]`).
const AUDIT = env.GATEWRAP_AUDIT || (RUN ? `gatewrap audit --run ${RUN}` : 'gatewrap audit');
// How to allow a host: gatewrap run's flag, or a container's annotation (gatewrap.shims.ALLOW_HOST).
const ALLOW = env.GATEWRAP_ALLOW || 'gatewrap run --allow HOST';

function dest(host, port) {
  return String(host).includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** "host[:port]" for a URL, the port left out when it is the scheme's default. */
function authority(host, port, defaultPort) {
  const h = net.isIPv6(String(host)) ? `[${host}]` : String(host || 'localhost');
  return !port || Number(port) === defaultPort ? h : `${h}:${port}`;
}

/** Whether host is a loopback address: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6. */
function isLoopback(host) {
  const h = String(host).toLowerCase();
  if (net.isIPv4(h)) return h.startsWith('127.');
  return net.isIPv6(h) && (h === '::1' || /^(0{0,4}:){0,5}:?ffff:127\./.test(h));
}

function explain(host, port) {
  const audit = `${AUDIT} --denied`;
  // NO_PROXY names loopback (env.toml), so clients dial it themselves; the sandbox's loopback
  // holds only the gate, which would send it to the host's loopback.
  const todo = isLoopback(host)
    ? `clients skip it for loopback (NO_PROXY): to send this through it, to the host's ${dest(host, port)} ` +
      "if the policy allows that address, unset NO_PROXY (curl: --noproxy '')"
    : `send the request through it (HTTP_PROXY/HTTPS_PROXY are set), with the host allowed there (${ALLOW})`;
  return `egress to ${dest(host, port)} was blocked by gatewrap: only the gate (${GATE}) is reachable; ` +
    `${todo}; the audit record: ${audit}`;
}

function isKernelRefusal(err) {
  return err && err.code === 'EPERM' && err.syscall === 'connect' && !err.gatewrap;
}

/** Give a kernel refusal (or an AggregateError of them: happy eyeballs tried every address)
 * gatewrap's explanation; code, errno, syscall, address and port are left as they are. */
function relabel(err) {
  const refused = [err, ...(Array.isArray(err.errors) ? err.errors : [])].filter(isKernelRefusal);
  for (const e of refused) {
    e.message = `connect EPERM: ${explain(e.address, e.port)}`;
    e.gatewrap = true;
  }
  if (refused.length && !refused.includes(err)) err.message = refused[0].message;
}

// net.Socket (and tls.TLSSocket) reports every failed connect through destroy(err).
const destroy = net.Socket.prototype.destroy;
net.Socket.prototype.destroy = function gatewrapDestroy(err, cb) {
  if (err) relabel(err);
  return destroy.call(this, err, cb);
};

function proxyFor(scheme) {
  const names = scheme === 'https' ? ['https_proxy', 'HTTPS_PROXY', 'all_proxy', 'ALL_PROXY']
    : ['http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY'];
  for (const n of names) {
    if (env[n]) {
      try {
        const u = new URL(env[n]);
        if (u.protocol === 'http:') return { host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port) || 80 };
      } catch { /* not a URL: ignore it, as curl does */ }
    }
  }
  return null;
}

const noProxy = (env.no_proxy || env.NO_PROXY || '').split(',').map((s) => s.trim().toLowerCase()).filter(Boolean);

/** True if `host` is to be dialled directly (NO_PROXY: exact names, suffixes, or "*"). */
function bypass(host) {
  const h = String(host || 'localhost').toLowerCase().replace(/^\[|\]$/g, '').replace(/\.$/, '');
  return noProxy.some((p) => {
    if (p === '*') return true;
    const q = p.replace(/^\*?\./, '').replace(/^\[|\]$/g, '');
    return h === q || h.endsWith(`.${q}`);
  });
}

/** Open a CONNECT tunnel through `gate` to host:port; cb(err, socket). A refusal (403 and the
 * gate's explanation) becomes an error whose message carries the gate's answer. */
function tunnel(gate, host, port, cb) {
  const target = dest(host, port);
  const req = http.request({ host: gate.host, port: gate.port, method: 'CONNECT', path: target,
    headers: { host: target }, agent: false });
  req.once('connect', (res, socket, head) => {
    if (res.statusCode === 200) {
      if (head && head.length) socket.unshift(head);
      cb(null, socket);
      return;
    }
    let body = head ? head.toString() : '';
    let answered = false;
    const done = () => {
      if (answered) return;
      answered = true;
      socket.destroy();
      const e = new Error(`gatewrap: the gate answered ${res.statusCode} to CONNECT ${target}: ` +
        `${body.trim().replace(/\s*\n\s*/g, ' ').slice(0, 400) || res.statusMessage}`);
      e.code = 'EGATEWRAPDENIED';
      e.statusCode = res.statusCode;
      cb(e);
    };
    const want = Number(res.headers['content-length'] || 0);
    if (body.length >= want) return done();
    const timer = setTimeout(done, 500);
    socket.on('data', (d) => { body += d; if (body.length >= want) { clearTimeout(timer); done(); } });
    socket.once('end', () => { clearTimeout(timer); done(); });
  });
  req.once('error', (e) => cb(e));
  req.end();
}

class GateHttpAgent extends http.Agent {
  constructor(gate, opts) { super(opts); this.gate = gate; }

  addRequest(req, options) {
    if (!bypass(options.host)) {
      if (!/^https?:\/\//i.test(req.path)) req.path = `http://${authority(options.host, options.port, 80)}${req.path}`;
      options = { ...options, gatewrapViaGate: true };
    }
    return super.addRequest(req, options);
  }

  createConnection(options, cb) {
    if (!options.gatewrapViaGate) return net.createConnection(options, cb);
    return net.createConnection({ host: this.gate.host, port: this.gate.port }, cb);
  }
}

class GateHttpsAgent extends https.Agent {
  constructor(gate, opts) { super(opts); this.gate = gate; }

  createConnection(options, cb) {
    const host = options.host || 'localhost';
    if (bypass(host)) return super.createConnection(options, cb);
    tunnel(this.gate, host, options.port || 443, (err, socket) => {
      if (err) return cb(err);
      const servername = options.servername || (net.isIP(host) ? undefined : host);
      cb(null, tls.connect({ ...options, socket, servername }));
    });
    return undefined;
  }
}

/** undici's `connect` option (undici docs, "Connector"): a tunnel, with TLS for https. */
function undiciConnector(gate) {
  return (opts, cb) => {
    const https_ = opts.protocol === 'https:';
    const port = Number(opts.port) || (https_ ? 443 : 80);
    const host = opts.hostname.replace(/^\[|\]$/g, '');
    const finish = (socket) => {
      if (!https_) return cb(null, socket);
      const t = tls.connect({ socket, servername: opts.servername || (net.isIP(host) ? undefined : host),
        ALPNProtocols: ['http/1.1'] });
      const fail = (e) => cb(e);
      t.once('error', fail);
      t.once('secureConnect', () => { t.removeListener('error', fail); cb(null, t); });
      return undefined;
    };
    if (bypass(host)) {
      const s = net.connect({ host, port });
      const fail = (e) => cb(e);
      s.once('error', fail);
      s.once('connect', () => { s.removeListener('error', fail); finish(s); });
      return;
    }
    tunnel(gate, host, port, (err, socket) => (err ? cb(err) : finish(socket)));
  };
}

const UNDICI_DISPATCHER = Symbol.for('undici.globalDispatcher.1');

function routeFetch(gate) {
  const original = globalThis.fetch;
  if (typeof original !== 'function') return;
  let installed = false;
  globalThis.fetch = function fetch(input, init) {
    if (!installed) {
      installed = true;
      if (globalThis[UNDICI_DISPATCHER] === undefined) {
        original('data:,').catch(() => {}); // makes undici create its global Agent
        const agent = globalThis[UNDICI_DISPATCHER];
        if (agent && typeof agent.constructor === 'function') {
          globalThis[UNDICI_DISPATCHER] = new agent.constructor({ connect: undiciConnector(gate) });
          agent.close().catch(() => {});
        }
      }
    }
    return original(input, init);
  };
}

// The options of Node's own global agents (Node >= 19: lib/_http_agent.js, lib/https.js).
const GLOBAL_AGENT_OPTIONS = { keepAlive: true, scheduling: 'lifo', timeout: 5000 };

function nodeHonoursEnvProxy() {
  const [major, minor] = process.versions.node.split('.').map(Number);
  return major > 24 || (major === 24 && minor >= 5) || (major === 22 && minor >= 21);
}

if (!(env.NODE_USE_ENV_PROXY === '1' && nodeHonoursEnvProxy())) {
  const httpGate = proxyFor('http');
  const httpsGate = proxyFor('https');
  if (httpGate) {
    http.globalAgent = new GateHttpAgent(httpGate, GLOBAL_AGENT_OPTIONS);
  }
  if (httpsGate) {
    https.globalAgent = new GateHttpsAgent(httpsGate, GLOBAL_AGENT_OPTIONS);
    routeFetch(httpsGate);
  }
}
