//! A loopback TCP relay in front of the database that a test can cut and
//! restore: the library's (the demo cuts its database the same way).

pub use jobfence::provider::netcut::NetCut as Proxy;
