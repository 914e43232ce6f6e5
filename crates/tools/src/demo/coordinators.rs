//! The demo's coordinators: one, or several behind HAProxy (configured
//! from `deploy/haproxy/jobfence.cfg`, as `scripts/cluster` does), all
//! reaching the database through a relay the demo can cut. What the chaos
//! schedule does to them: restart one (SIGTERM: it drains), kill one
//! (SIGKILL), cut the database off for a few seconds; and what it measures:
//! how long health and the load balancer took to notice.

use crate::procs::{self, Proc};
use anyhow::{bail, Context, Result};
use jobfence_fake_provider::netcut::NetCut;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The HAProxy configuration the project ships; `scripts/cluster` and the
/// tests render the same file.
pub const HAPROXY_TEMPLATE: &str = include_str!("../../../../deploy/haproxy/jobfence.cfg");

/// The answer HAProxy gives when no coordinator is up: gRPC UNAVAILABLE
/// (the template's `errorfile 503`).
pub const GRPC_UNAVAILABLE: &str = include_str!("../../../../deploy/haproxy/grpc-unavailable.http");

/// HAProxy's TLS: it terminates the clients' TLS with `frontend_pem` and
/// re-encrypts to the coordinators, verifying them against `ca`.
#[derive(Debug, Clone)]
pub struct HaproxyTls {
    /// The certificate and its key in one PEM file (absolute path).
    pub frontend_pem: PathBuf,
    /// The CA that signed the coordinators' certificates (absolute path).
    pub ca: PathBuf,
}

/// The HAProxy configuration for `servers` (name, gRPC address, metrics
/// port), listening on `listen`, with its runtime API on `socket` and
/// [`GRPC_UNAVAILABLE`] at `errorfile` (both absolute paths); TLS on both
/// sides with `tls`, cleartext HTTP/2 without.
pub fn haproxy_config(
    listen: &str,
    socket: &Path,
    errorfile: &Path,
    servers: &[(String, String, u16)],
    tls: Option<&HaproxyTls>,
) -> String {
    let upstream = match tls {
        Some(t) => format!(
            "ssl verify required ca-file {} verifyhost localhost alpn h2 proto h2",
            t.ca.display()
        ),
        None => "proto h2".to_owned(),
    };
    // Health checks go to the plain-HTTP metrics port either way.
    let check_tls = if tls.is_some() { " no-check-ssl" } else { "" };
    let lines: Vec<String> = servers
        .iter()
        .map(|(name, grpc, metrics)| {
            format!(
                "    server {name} {grpc} {upstream} check port {metrics} check-proto h1{check_tls}"
            )
        })
        .collect();
    let bind = match tls {
        Some(t) => format!("ssl crt {} alpn h2", t.frontend_pem.display()),
        None => "proto h2".to_owned(),
    };
    HAPROXY_TEMPLATE
        .replace("@LISTEN@", listen)
        .replace("@BIND@", &bind)
        .replace("@STATS_SOCKET@", &socket.display().to_string())
        .replace("@GRPC_UNAVAILABLE@", &errorfile.display().to_string())
        .replace("@SERVERS@", &lines.join("\n"))
}

/// The haproxy program: `JOBFENCE_HAPROXY`, else Debian's.
pub fn haproxy_bin() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("JOBFENCE_HAPROXY") {
        return Ok(p.into());
    }
    for p in [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ] {
        if Path::new(p).exists() {
            return Ok(p.into());
        }
    }
    bail!(
        "haproxy not found (scripts/demo installs it with scripts/cluster install; \
         or run with --coordinators 1)"
    )
}

/// A loopback port that was free a moment ago, for HAProxy's frontend:
/// HAProxy cannot bind port 0 and say which port it got (2.6 refuses
/// `bind 127.0.0.1:0`: "invalid port '0'"), so its port is chosen in
/// advance, and another process may take it first. Every other process
/// of the demo binds port 0 and logs its address.
fn haproxy_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// HAProxy's status of a server (`UP`, `DOWN`, …), from its runtime API.
pub async fn haproxy_status(socket: &Path, server: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(socket).await?;
    s.write_all(b"show stat\n").await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.len() > 17 && f[0] == "coordinators" && f[1] == server)
        .map(|f| f[17].to_owned())
        .unwrap_or_else(|| "MISSING".into()))
}

/// One coordinator process.
#[derive(Debug)]
pub struct Coordinator {
    pub name: String,
    pub grpc: String,
    pub metrics: String,
    /// Where it serves the console, if it does.
    pub console: Option<String>,
    pub proc: Proc,
}

impl Coordinator {
    /// `GET /healthz`: true for 200, false for 503 or no answer.
    pub async fn healthy(&self) -> bool {
        let url = format!("http://{}/healthz", self.metrics);
        let client = reqwest::Client::new();
        match client.get(url).timeout(Duration::from_secs(1)).send().await {
            Ok(r) => r.status() == reqwest::StatusCode::OK,
            Err(_) => false,
        }
    }
}

/// How the coordinators are run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// TLS and callers for every coordinator, HAProxy's TLS, and the
    /// credentials this process checks health with; `None` runs them
    /// `--insecure`.
    pub credentials: Option<super::credentials::DemoCredentials>,
    pub exe: PathBuf,
    pub logs: PathBuf,
    /// `jobfence serve` flags every coordinator gets (lease, window, …),
    /// besides its addresses and the database URL.
    pub serve_flags: Vec<String>,
    /// Whether the first coordinator serves the console.
    pub console: bool,
    /// Flags for the first coordinator only (the console's credential).
    pub first_only: Vec<String>,
}

/// The databases the coordinators use.
#[derive(Debug, Clone)]
pub enum Databases {
    /// One database, through these nodes (one URL, or a Galera cluster's
    /// nodes in order of preference).
    Nodes(Vec<String>),
    /// Several databases, each `(URL, queue placed on it)`; database k is
    /// the k-th.
    Shards(Vec<(String, String)>),
}

/// `prefix`, `host:port` and `/db` of a `mysql://user:pass@IP:PORT/db` URL.
fn split_url(url: &str) -> Result<(&str, std::net::SocketAddr, &str)> {
    let (head, db) = url
        .rsplit_once('/')
        .context("the database URL needs a database name")?;
    let (prefix, host_port) = match head.rfind('@') {
        Some(i) => (&head[..=i], &head[i + 1..]),
        None => ("mysql://", head.trim_start_matches("mysql://")),
    };
    let upstream = host_port
        .parse()
        .context("the demo needs the database as mysql://user:pass@IP:PORT/db")?;
    Ok((prefix, upstream, db))
}

/// The relays: one per database server, and each URL rewritten to go
/// through its server's relay.
struct Relays {
    cuts: Vec<NetCut>,
}

impl Relays {
    async fn through(&mut self, url: &str) -> Result<String> {
        let (prefix, upstream, db) = split_url(url)?;
        let cut = match self.cuts.iter().position(|c| c.upstream == upstream) {
            Some(i) => &self.cuts[i],
            None => {
                self.cuts.push(NetCut::start(upstream).await?);
                self.cuts.last().expect("just pushed")
            }
        };
        Ok(format!("{prefix}{}/{db}", cut.addr))
    }
}

/// The coordinators, the load balancer in front of them, and the relays
/// between them and the database servers.
pub struct Coordinators {
    settings: Settings,
    /// The `jobfence serve` flags that name the databases (through the
    /// relays).
    db_flags: Vec<String>,
    /// One relay per database server.
    pub db_cuts: Vec<NetCut>,
    pub list: Vec<Coordinator>,
    haproxy: Option<(Proc, PathBuf)>,
    /// The address workers and operators call.
    pub addr: String,
    /// The worker calls of coordinators that stopped since they started
    /// (their counters die with them).
    pub calls: super::calls::WorkerCalls,
}

impl Coordinators {
    /// Starts `n` coordinators on `databases` (through relays), and
    /// HAProxy in front of them when there are several. The first one's
    /// metrics go to `metrics_listen` when given.
    pub async fn start(
        n: u32,
        databases: &Databases,
        settings: Settings,
        metrics_listen: Option<&str>,
    ) -> Result<Coordinators> {
        let (db_flags, db_cuts) = db_flags(databases, &settings.logs).await?;
        let mut list = Vec::new();
        for i in 1..=n.max(1) {
            // Port 0 (the addresses are read back from its log), but for
            // the metrics address `--metrics-listen` asked for.
            let listen = Listen {
                grpc: "127.0.0.1:0".into(),
                metrics: match (i, metrics_listen) {
                    (1, Some(m)) => m.to_owned(),
                    _ => "127.0.0.1:0".into(),
                },
                console: (i == 1 && settings.console).then(|| "127.0.0.1:0".into()),
            };
            let name = format!("coordinator-{i}");
            let proc = spawn(&settings, &db_flags, &name, &listen)?;
            list.push(Coordinator::bound(name, proc, listen.console.is_some()).await?);
        }
        for c in &list {
            super::wait_coordinator(&c.grpc, &settings.client()?).await?;
        }
        let (haproxy, addr) = if list.len() > 1 {
            let (proc, socket, listen) = start_haproxy(&settings, &list).await?;
            (Some((proc, socket)), listen)
        } else {
            (None, list[0].grpc.clone())
        };
        Ok(Coordinators {
            settings,
            db_flags,
            db_cuts,
            list,
            haproxy,
            addr,
            calls: Default::default(),
        })
    }

    /// Waits until every coordinator reports `healthy` (SERVING or not),
    /// up to `limit`; how long it took.
    pub async fn until_health(&self, healthy: bool, limit: Duration) -> Result<Duration> {
        self.until_all(healthy, limit).await
    }

    /// Each coordinator's `/metrics` text (empty for one that does not
    /// answer).
    pub async fn scrape(&self) -> Vec<String> {
        let client = reqwest::Client::new();
        let mut out = Vec::new();
        for c in &self.list {
            let url = format!("http://{}/metrics", c.metrics);
            let text = match client.get(url).timeout(Duration::from_secs(2)).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            out.push(text);
        }
        out
    }

    /// Whether a load balancer is in front.
    pub fn balanced(&self) -> bool {
        self.haproxy.is_some()
    }

    /// SIGTERM to coordinator `i` (it drains), start it again, wait until
    /// it serves. Returns how long it took to stop.
    pub async fn restart(&mut self, i: usize) -> Result<Duration> {
        self.keep_calls(i).await;
        let started = Instant::now();
        self.list[i].proc.stop(Duration::from_secs(15)).await?;
        let stopped = started.elapsed();
        self.respawn(i).await?;
        Ok(stopped)
    }

    /// SIGKILL to coordinator `i`; returns how long until HAProxy took it
    /// out (it is started again).
    pub async fn kill(&mut self, i: usize) -> Result<Option<Duration>> {
        self.keep_calls(i).await;
        let killed = Instant::now();
        self.list[i].proc.kill().await?;
        let noticed = match &self.haproxy {
            Some((_, socket)) => {
                let name = self.list[i].name.clone();
                loop {
                    if haproxy_status(socket, &name).await?.starts_with("DOWN") {
                        break Some(killed.elapsed());
                    }
                    if killed.elapsed() > Duration::from_secs(10) {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
            None => None,
        };
        self.respawn(i).await?;
        Ok(noticed)
    }

    /// SIGKILL to every coordinator at once: no drain, no answer to the
    /// calls in flight, and HAProxy answers every call itself
    /// (UNAVAILABLE) until they are started again ([`Self::start_all`]).
    pub async fn kill_all(&mut self) -> Result<()> {
        for i in 0..self.list.len() {
            self.keep_calls(i).await;
        }
        for c in &mut self.list {
            c.proc.kill().await?;
        }
        Ok(())
    }

    /// Starts every coordinator again on its addresses, all at once, and
    /// waits until each serves and HAProxy sends it calls.
    pub async fn start_all(&mut self) -> Result<()> {
        for i in 0..self.list.len() {
            self.spawn_again(i)?;
        }
        for i in 0..self.list.len() {
            self.until_up(i).await?;
        }
        Ok(())
    }

    /// Starts coordinator `i` again on the addresses it had: HAProxy's
    /// configuration names them, and the workers call them.
    fn spawn_again(&mut self, i: usize) -> Result<()> {
        let c = &self.list[i];
        let listen = Listen {
            grpc: c.grpc.clone(),
            metrics: c.metrics.clone(),
            console: c.console.clone(),
        };
        let proc = spawn(&self.settings, &self.db_flags, &c.name, &listen)?;
        self.list[i] = Coordinator {
            name: c.name.clone(),
            grpc: listen.grpc,
            metrics: listen.metrics,
            console: listen.console,
            proc,
        };
        Ok(())
    }

    async fn respawn(&mut self, i: usize) -> Result<()> {
        self.spawn_again(i)?;
        self.until_up(i).await
    }

    /// Waits until coordinator `i` serves, and HAProxy marks it up.
    async fn until_up(&self, i: usize) -> Result<()> {
        let (name, grpc) = (self.list[i].name.clone(), self.list[i].grpc.clone());
        super::wait_coordinator(&grpc, &self.settings.client()?).await?;
        // A rolling restart moves on only once the load balancer sends
        // calls to this one again (two passed checks, about a second):
        // otherwise the next stop could leave no coordinator up.
        if let Some((_, socket)) = &self.haproxy {
            let since = Instant::now();
            while !haproxy_status(socket, &name).await?.starts_with("UP") {
                if since.elapsed() > Duration::from_secs(10) {
                    bail!("HAProxy did not mark {name} UP within 10 s of its restart");
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        Ok(())
    }

    /// Cuts the database off for `outage`. Returns, for the slowest
    /// coordinator, how long health took to turn NOT_SERVING, and then
    /// SERVING again once the database was back.
    pub async fn database_outage(&mut self, outage: Duration) -> Result<(Duration, Duration)> {
        let cut = Instant::now();
        for c in &self.db_cuts {
            c.cut();
        }
        let down = self.until_all(false, Duration::from_secs(10)).await?;
        let rest = outage.saturating_sub(cut.elapsed());
        tokio::time::sleep(rest).await;
        for c in &self.db_cuts {
            c.restore();
        }
        let up = self.until_all(true, Duration::from_secs(10)).await?;
        Ok((down, up))
    }

    async fn until_all(&self, healthy: bool, limit: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let mut all = true;
            for c in &self.list {
                all &= c.healthy().await == healthy;
            }
            if all {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!(
                    "the coordinators did not turn {} within {limit:?}",
                    if healthy { "SERVING" } else { "NOT_SERVING" }
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The first process that exited on its own, if any.
    pub fn exited(&mut self) -> Option<(String, std::process::ExitStatus, PathBuf)> {
        let haproxy = self.haproxy.as_mut().map(|(p, _)| p);
        for p in self.list.iter_mut().map(|c| &mut c.proc).chain(haproxy) {
            if let Some(status) = p.exited() {
                return Some((p.name.clone(), status, p.log.clone()));
            }
        }
        None
    }

    /// Stops every coordinator (they drain), then the load balancer.
    pub async fn stop(&mut self) {
        for c in &mut self.list {
            let _ = c.proc.stop(Duration::from_secs(10)).await;
        }
        if let Some((p, _)) = &mut self.haproxy {
            let _ = p.stop(Duration::from_secs(5)).await;
        }
    }
}

impl Settings {
    /// The credentials a health check of this process presents (health
    /// needs none, but TLS needs the CA).
    fn client(&self) -> Result<jobfence_worker::Credentials> {
        match &self.credentials {
            Some(c) => c.client(super::credentials::PRODUCER),
            None => Ok(jobfence_worker::Credentials::default()),
        }
    }
}

/// Where a coordinator listens: port 0 at its first start (it logs the
/// port it got), its old addresses when it is started again.
struct Listen {
    grpc: String,
    metrics: String,
    /// The console's, for the coordinator that serves it.
    console: Option<String>,
}

impl Coordinator {
    /// `proc`, a coordinator just started, with the addresses it logged:
    /// gRPC, metrics, and the console's if it serves it.
    async fn bound(name: String, mut proc: Proc, console: bool) -> Result<Coordinator> {
        let grpc = proc.listen_addr(procs::SERVING_GRPC).await?.to_string();
        let metrics = proc.listen_addr(procs::SERVING_METRICS).await?.to_string();
        let console = if console {
            Some(proc.listen_addr(procs::SERVING_CONSOLE).await?.to_string())
        } else {
            None
        };
        Ok(Coordinator {
            name,
            grpc,
            metrics,
            console,
            proc,
        })
    }
}

/// The `jobfence serve` flags that name the databases, each reached
/// through a relay (one per database server, returned too) that the demo
/// can cut.
async fn db_flags(databases: &Databases, logs: &Path) -> Result<(Vec<String>, Vec<NetCut>)> {
    let mut relays = Relays { cuts: Vec::new() };
    let flags = match databases {
        Databases::Nodes(urls) => {
            let mut through = Vec::new();
            for u in urls {
                through.push(relays.through(u).await?);
            }
            vec!["--database-url".to_owned(), through.join(",")]
        }
        Databases::Shards(list) => {
            let mut file = String::from("# written by jobfence demo --shards\n");
            for (k, (url, queue)) in list.iter().enumerate() {
                file.push_str(&format!("database {k} {}\n", relays.through(url).await?));
                file.push_str(&format!("queue {queue} {k}\n"));
            }
            let path = std::fs::canonicalize(logs)?.join("shards.conf");
            std::fs::write(&path, file)?;
            vec!["--shards".to_owned(), path.display().to_string()]
        }
    };
    Ok((flags, relays.cuts))
}

/// HAProxy in front of `list`, configured from the project's file; its
/// process, its runtime API socket, and the address it serves, once it
/// does.
async fn start_haproxy(
    settings: &Settings,
    list: &[Coordinator],
) -> Result<(Proc, PathBuf, String)> {
    let listen = format!("127.0.0.1:{}", haproxy_port()?);
    // HAProxy reads a stats socket path only when it is absolute.
    let dir = std::fs::canonicalize(&settings.logs)?;
    let socket = dir.join("haproxy.sock");
    let errorfile = dir.join("grpc-unavailable.http");
    std::fs::write(&errorfile, GRPC_UNAVAILABLE)?;
    let servers: Vec<(String, String, u16)> = list
        .iter()
        .map(|c| {
            let port = c
                .metrics
                .rsplit_once(':')
                .map_or(0, |(_, p)| p.parse().unwrap_or(0));
            (c.name.clone(), c.grpc.clone(), port)
        })
        .collect();
    let config = settings.logs.join("haproxy.cfg");
    let tls = settings.credentials.as_ref().map(|c| c.haproxy());
    std::fs::write(
        &config,
        haproxy_config(&listen, &socket, &errorfile, &servers, tls.as_ref()),
    )?;
    let proc = Proc::spawn(
        "haproxy",
        &haproxy_bin()?,
        &["-db".into(), "-f".into(), config.display().to_string()],
        &[],
        &settings.logs,
    )?;
    super::wait_coordinator(&listen, &settings.client()?).await?;
    Ok((proc, socket, listen))
}

/// Starts coordinator `name` on `listen`.
fn spawn(settings: &Settings, db_flags: &[String], name: &str, listen: &Listen) -> Result<Proc> {
    let mut args: Vec<String> = vec!["serve".into()];
    args.extend(db_flags.iter().cloned());
    args.extend([
        "--listen".into(),
        listen.grpc.clone(),
        "--metrics-listen".into(),
        listen.metrics.clone(),
        "--coordinator-name".into(),
        name.into(),
    ]);
    if let Some(console) = &listen.console {
        args.extend(["--console-listen".into(), console.clone()]);
    }
    match &settings.credentials {
        Some(c) => args.extend(c.serve_flags()),
        None => args.push("--insecure".into()),
    }
    args.extend(settings.serve_flags.iter().cloned());
    if name.ends_with("-1") {
        args.extend(settings.first_only.iter().cloned());
    }
    // The lines that say where it listens are read back from its log,
    // whatever the filter this process was given.
    let filter = std::env::var("JOBFENCE_LOG").unwrap_or_else(|_| "info".into());
    let env = [("JOBFENCE_LOG", procs::serve_log_filter(&filter))];
    Proc::spawn(name, &settings.exe, &args, &env, &settings.logs)
}
