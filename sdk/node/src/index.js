'use strict';
// jobfence worker client for Node: the same protocol rules as the Rust SDK
// (see README.md). Only a committed Claim/Takeover hands out a ClaimedJob;
// every write goes through it and presents its attempt; refusals are typed
// errors, one class per ErrorInfo reason.

const client = require('./client');
const errors = require('./errors');

module.exports = {
  WorkerClient: client.WorkerClient,
  ClaimedJob: client.ClaimedJob,
  Disposition: client.Disposition,
  RetryPolicy: client.RetryPolicy,
  observationDedupKey: client.observationDedupKey,
  credentialsFromEnv: client.credentialsFromEnv,
  errors,
  ...Object.fromEntries(Object.entries(errors).filter(([k]) => /^[A-Z]/.test(k))),
};
