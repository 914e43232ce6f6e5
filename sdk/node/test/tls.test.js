'use strict';
// TLS to a coordinator named by its IP address (127.0.0.1, as the demo and
// scripts/serve run it): the call goes through, the certificate checked
// against the address, and Node prints no DEP0123 warning (a TLS server
// name set to an IP address). Against a real gRPC server over TLS in this
// process, with a throw-away certificate for IP 127.0.0.1 made by openssl.

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const jw = require('..');
const { protoRoot } = require('../src/client');

/** A self-signed certificate for IP 127.0.0.1: { cert, key } (PEM). */
function certificateFor127(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'jobfence-node-tls-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const key = path.join(dir, 'key.pem');
  const cert = path.join(dir, 'cert.pem');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-subj', '/CN=coordinator', '-addext', 'subjectAltName=IP:127.0.0.1', '-days', '1',
    '-keyout', key, '-out', cert,
  ], { stdio: 'ignore' });
  return { cert: fs.readFileSync(cert), key: fs.readFileSync(key) };
}

test('TLS to an IP address: the call goes through and Node warns of no server name', async (t) => {
  const warnings = [];
  const onWarning = (w) => warnings.push(`${w.code || ''} ${w.message}`);
  process.on('warning', onWarning);
  t.after(() => process.off('warning', onWarning));
  const { cert, key } = certificateFor127(t);
  const definition = protoLoader.loadSync('jobfence/v1/coordinator.proto', {
    includeDirs: [protoRoot()], keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true,
  });
  const Service = grpc.loadPackageDefinition(definition).jobfence.v1.JobCoordinator;
  const server = new grpc.Server();
  server.addService(Service.service, {
    Claim(call, callback) {
      callback(null, { jobs: [] });
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createSsl(null, [{ cert_chain: cert, private_key: key }]),
      (err, p) => (err ? reject(err) : resolve(p)));
  });
  const client = new jw.WorkerClient({
    target: `127.0.0.1:${port}`, workerId: 'node-tls', queue: 'refunds', credentials: { tlsCaPem: cert },
  });
  t.after(() => {
    client.close();
    server.forceShutdown();
  });
  const jobs = await client.claim(1);
  assert.deepStrictEqual(jobs, []);
  // Warnings are emitted on the next tick.
  await new Promise((resolve) => setImmediate(resolve));
  assert.deepStrictEqual(warnings.filter((w) => w.includes('DEP0123')), []);
});
