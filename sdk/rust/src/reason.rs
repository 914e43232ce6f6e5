//! The `google.rpc.ErrorInfo` reasons a coordinator attaches to its
//! refusals (domain [`ERROR_DOMAIN`]), as plain names: the API's contract,
//! generated (in the crate `jobfence-api`) from the enum `ErrorReason` of
//! `proto/jobfence/v1/errors.proto`, so a client needs nothing of the
//! coordinator's code and cannot miss a reason the coordinator sends.
//!
//! Workers rarely need them: [`WriteError`](crate::WriteError) and
//! [`ClaimError`](crate::ClaimError) already switch on them.

pub use jobfence_api::reason::*;
pub use jobfence_api::ERROR_DOMAIN;
