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

/// The version of the API (semver, this crate's version: `proto/Cargo.toml`
/// is the one place it is written). A coordinator names it in the response
/// header [`VERSION_HEADER`] of every call; a client refuses a coordinator
/// whose major version is not [`MAJOR`]. A new major version is a change
/// a client of the old one cannot read (a message or a rule changed
/// meaning); additions are minor versions.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The major version of [`VERSION`]: the API a client built on this crate
/// speaks.
pub const MAJOR: &str = env!("CARGO_PKG_VERSION_MAJOR");

/// The response header (gRPC initial metadata) in which a coordinator names
/// the API version it speaks, e.g. `jobfence-api-version: 1.2.0`. A
/// coordinator without it is older than the header: clients accept it, so
/// that a rolling upgrade never refuses a coordinator for its age.
pub const VERSION_HEADER: &str = "jobfence-api-version";

/// The major version named by an API version string (`"1.4.0"` → `Some(1)`);
/// `None` when it does not start with a number.
pub fn major_of(version: &str) -> Option<u64> {
    version.trim().split('.').next()?.parse().ok()
}

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
    fn the_major_version_is_read_off_a_version_string() {
        assert_eq!(
            super::major_of(super::VERSION)
                .map(|m| m.to_string())
                .as_deref(),
            Some(super::MAJOR)
        );
        assert_eq!(super::major_of("2.0.0"), Some(2));
        assert_eq!(super::major_of("1"), Some(1));
        assert_eq!(super::major_of("v1.0"), None);
        assert_eq!(super::major_of(""), None);
    }

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
