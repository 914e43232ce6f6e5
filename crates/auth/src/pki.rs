//! Issuing credentials: bearer tokens and their callers-file lines, and a
//! throw-away certificate authority for development (`jobfence
//! credentials dev`, used by `scripts/serve`, `scripts/demo` and the
//! tests). A production CA is the operator's own; nothing here is meant to
//! replace it.

use super::callers::token_digest;
use super::Role;
use anyhow::Context;
use chrono::{DateTime, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A new bearer token: `jft_` and 64 hex digits of 32 random bytes (the
/// prefix lets secret scanners recognise a leaked one).
pub fn new_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).context("reading the system's random source")?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("jft_{hex}"))
}

/// The callers-file line granting `role` on `queues` (`*` or a
/// comma-separated list) to `name`, for `token` (stored as its SHA-256).
pub fn callers_line(
    name: &str,
    role: Role,
    queues: &str,
    token: &str,
    expires: Option<DateTime<Utc>>,
) -> String {
    let hex: String = token_digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut line = format!("{name} {role} {queues} sha256:{hex}");
    if let Some(at) = expires {
        line.push_str(&format!(
            " expires={}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    line
}

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct CertPem {
    /// The certificate.
    pub cert: String,
    /// Its private key (PKCS#8).
    pub key: String,
}

/// A throw-away CA: signs the server's certificate and client
/// certificates. Its key lives in memory only.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "jobfence development");
    dn.push(DnType::CommonName, cn);
    dn
}

impl DevCa {
    /// A new CA named `cn`, valid from now for about a year.
    pub fn new(cn: &str) -> anyhow::Result<DevCa> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = time_now() - std::time::Duration::from_secs(3600);
        params.not_after = time_now() + std::time::Duration::from_secs(365 * 24 * 3600);
        let cert = params.self_signed(&key)?;
        Ok(DevCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA's certificate (PEM): what clients trust (`JOBFENCE_TLS_CA`,
    /// `grpcurl -cacert`) and, for mutual TLS, `--tls-client-ca`.
    pub fn cert_pem(&self) -> &str {
        &self.pem
    }

    fn leaf(
        &self,
        cn: &str,
        sans: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<CertPem> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name = name(cn);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.not_before = time_now() - std::time::Duration::from_secs(3600);
        params.not_after = time_now() + std::time::Duration::from_secs(90 * 24 * 3600);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(CertPem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// A server certificate for `hosts` (DNS names or IP addresses; the
    /// first is also its common name).
    pub fn server_cert(&self, hosts: &[&str]) -> anyhow::Result<CertPem> {
        let cn = hosts.first().copied().unwrap_or("localhost");
        self.leaf(cn, hosts, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose subject common name is `cn`: the caller
    /// name a `cert` line of the callers file binds.
    pub fn client_cert(&self, cn: &str) -> anyhow::Result<CertPem> {
        self.leaf(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

/// Writes `contents` to `path`, readable by its owner only (a key, a token).
pub fn write_secret(path: &Path, contents: &str) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(contents.as_bytes())?;
    Ok(())
}

/// One caller of a development setup: a name, a role and its queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCaller {
    /// The caller's name (and the token file's name).
    pub name: String,
    /// Its role.
    pub role: Role,
    /// `*` or a comma-separated list of queues.
    pub queues: String,
}

impl std::str::FromStr for DevCaller {
    type Err = String;

    /// `NAME:ROLE:QUEUES`, e.g. `rust-1:worker:refunds` or `alice:operator:*`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(3, ':');
        let (Some(name), Some(role), Some(queues)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "{s:?}: expected NAME:ROLE:QUEUES, e.g. rust-1:worker:refunds"
            ));
        };
        Ok(DevCaller {
            name: name.to_owned(),
            role: role.parse()?,
            queues: queues.to_owned(),
        })
    }
}

/// What [`dev_setup`] wrote, by path.
#[derive(Debug, Clone)]
pub struct DevFiles {
    /// The directory.
    pub dir: PathBuf,
    /// `ca.pem`: the CA to trust.
    pub ca: PathBuf,
    /// `server.pem`, `server-key.pem`.
    pub server_cert: PathBuf,
    /// See `server_cert`.
    pub server_key: PathBuf,
    /// `callers`: the callers file.
    pub callers: PathBuf,
}

impl DevFiles {
    /// `tokens/NAME`: the bearer token of caller NAME.
    pub fn token(&self, name: &str) -> PathBuf {
        self.dir.join("tokens").join(name)
    }

    /// `clients/NAME.pem` and `clients/NAME-key.pem`: a client certificate
    /// (subject CN=NAME) and its key.
    pub fn client_cert(&self, name: &str) -> (PathBuf, PathBuf) {
        let d = self.dir.join("clients");
        (
            d.join(format!("{name}.pem")),
            d.join(format!("{name}-key.pem")),
        )
    }
}

/// Writes a throw-away development setup into `dir`: a CA, a server
/// certificate for `hosts`, a token per caller (in `tokens/`, mode 0600),
/// the callers file granting them, and a client certificate (in
/// `clients/`) for each name in `client_certs` (bound in the callers file
/// with the same role as the caller of that name, if there is one). Any
/// previous setup in `dir` is replaced.
pub fn dev_setup(
    dir: &Path,
    hosts: &[&str],
    callers: &[DevCaller],
    client_certs: &[String],
) -> anyhow::Result<DevFiles> {
    std::fs::create_dir_all(dir.join("tokens"))
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::create_dir_all(dir.join("clients"))?;
    let files = DevFiles {
        dir: dir.to_owned(),
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        callers: dir.join("callers"),
    };
    let ca = DevCa::new("jobfence development CA")?;
    std::fs::write(&files.ca, ca.cert_pem())?;
    let server = ca.server_cert(hosts)?;
    std::fs::write(&files.server_cert, &server.cert)?;
    write_secret(&files.server_key, &server.key)?;
    let mut lines = vec![
        "# Throw-away development credentials written by `jobfence credentials dev`.".to_owned(),
        "# NAME ROLE QUEUES CREDENTIAL [expires=RFC3339] (docs/security.md)".to_owned(),
    ];
    let mut tokens: std::collections::HashMap<String, String> = Default::default();
    for c in callers {
        let token = match tokens.get(&c.name) {
            Some(t) => t.clone(),
            None => {
                let t = new_token()?;
                write_secret(&files.token(&c.name), &format!("{t}\n"))?;
                tokens.insert(c.name.clone(), t.clone());
                t
            }
        };
        lines.push(callers_line(&c.name, c.role, &c.queues, &token, None));
    }
    for name in client_certs {
        let cert = ca.client_cert(name)?;
        let (cert_path, key_path) = files.client_cert(name);
        std::fs::write(&cert_path, &cert.cert)?;
        write_secret(&key_path, &cert.key)?;
        for c in callers.iter().filter(|c| &c.name == name) {
            lines.push(format!("{} {} {} cert", c.name, c.role, c.queues));
        }
    }
    lines.push(String::new());
    std::fs::write(&files.callers, lines.join("\n"))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Callers;

    #[test]
    fn an_issued_token_authenticates_by_its_line() {
        let token = new_token().unwrap();
        assert!(token.starts_with("jft_") && token.len() == 68);
        assert_ne!(token, new_token().unwrap());
        let line = callers_line("rust-1", Role::Worker, "refunds", &token, None);
        assert!(!line.contains(&token));
        let callers = Callers::parse(&line).unwrap();
        let c = callers
            .authenticate(Some(&token), None, Utc::now())
            .unwrap();
        assert_eq!(c.name, "rust-1");
    }

    #[test]
    fn dev_callers_parse() {
        let c: DevCaller = "alice:operator:*".parse().unwrap();
        assert_eq!((c.name.as_str(), c.role), ("alice", Role::Operator));
        assert!("alice:boss:*".parse::<DevCaller>().is_err());
        assert!("alice".parse::<DevCaller>().is_err());
    }

    #[test]
    fn a_client_certificate_carries_its_name() {
        let ca = DevCa::new("test CA").unwrap();
        let client = ca.client_cert("rust-1").unwrap();
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let der =
            tokio_rustls::rustls::pki_types::CertificateDer::from_pem_slice(client.cert.as_bytes())
                .unwrap();
        assert_eq!(
            crate::certificate::common_name(&der).as_deref(),
            Some("rust-1")
        );
    }
}
