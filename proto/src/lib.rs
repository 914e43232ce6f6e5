//! The jobfence gRPC API, generated once from this crate's `.proto` files
//! (`jobfence/v1/*.proto`, packaged with it): what a coordinator serves and
//! what every client speaks.
//!
//! - [`v1`]: the messages of `jobfence.v1`; with the feature `client`, the
//!   clients of `JobCoordinator`, `JobAdmin` and `JobEvents`; with
//!   `server`, their server traits.
//! - [`reason`]: every `google.rpc.ErrorInfo` reason a coordinator sends
//!   (domain [`ERROR_DOMAIN`]), generated from the enum
//!   [`v1::ErrorReason`] of `errors.proto`, with the status code each one
//!   comes with.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for server
//!   reflection.
//!
//! Without features the crate needs prost only (no tonic), so the layers of
//! the coordinator that only name reasons do not build a gRPC stack.

#[cfg(feature = "server")]
pub mod codec;

/// The ErrorInfo domain of every jobfence error.
pub const ERROR_DOMAIN: &str = "jobfence";

/// Generated protobuf messages, clients (feature `client`) and servers
/// (feature `server`) of `jobfence.v1`.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/jobfence.v1.rs"));
    #[cfg(feature = "server")]
    include!(concat!(env!("OUT_DIR"), "/server/jobfence.v1.rs"));
}

/// The ErrorInfo reasons a coordinator attaches to its refusals (domain
/// [`ERROR_DOMAIN`]), as plain names, one constant per value of
/// [`v1::ErrorReason`] (`proto/jobfence/v1/errors.proto`), with [`ALL`]
/// and [`DENIALS`]; [`v1::ErrorReason::code`] is the status code each one
/// comes with.
pub mod reason {
    include!(concat!(env!("OUT_DIR"), "/reasons.rs"));
}

/// Encoded file descriptor set of every `.proto` file of the API (and the
/// well-known types they import), served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/jobfence_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::reason;
    use super::v1::ErrorReason;

    #[test]
    fn every_reason_is_named_like_its_enum_value() {
        assert_eq!(reason::ALL.len(), ErrorReason::ALL.len());
        for (name, value) in reason::ALL.iter().zip(ErrorReason::ALL) {
            assert_eq!(*name, value.as_str_name());
            assert_eq!(ErrorReason::from_str_name(name), Some(value));
        }
        assert!(reason::DENIALS.iter().all(|d| reason::ALL.contains(d)));
        assert_eq!(
            ErrorReason::AttemptSuperseded.code_name(),
            "FAILED_PRECONDITION"
        );
    }
}
