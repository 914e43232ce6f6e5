'use strict';
// Where the API's .proto files are, and what the package reads from them:
// the JobCoordinator service (client.js) and the ErrorInfo reasons of
// errors.proto (errors.js builds its REASONS from them).

const fs = require('node:fs');
const path = require('node:path');
const protoLoader = require('@grpc/proto-loader');

/** The directory holding jobfence/v1/coordinator.proto. */
function protoRoot() {
  const candidates = [
    process.env.JOBFENCE_PROTO_DIR,
    path.join(__dirname, '..', 'proto'), // a packed package (npm pack copies it)
    path.join(__dirname, '..', '..', '..', 'proto'), // sdk/node in a jobfence checkout
  ].filter(Boolean);
  const found = candidates.find((d) => fs.existsSync(path.join(d, 'jobfence', 'v1', 'coordinator.proto')));
  if (!found) throw new Error(`jobfence/v1/coordinator.proto not found in ${candidates.join(', ')}`);
  return found;
}

/** Every ErrorInfo reason a coordinator sends: the values of
 * jobfence.v1.ErrorReason (errors.proto) but the zero one, in order. */
function errorReasons() {
  const definition = protoLoader.loadSync('jobfence/v1/errors.proto', { includeDirs: [protoRoot()] });
  return definition['jobfence.v1.ErrorReason'].type.value
    .filter((v) => v.number !== 0)
    .map((v) => v.name);
}

module.exports = { protoRoot, errorReasons };
