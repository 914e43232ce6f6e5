//! Child processes of the demo and the benchmark: started with their
//! output in a log file, paused (SIGSTOP), resumed (SIGCONT), killed
//! (SIGKILL) or stopped (SIGTERM) on purpose; the addresses they bound
//! (they listen on port 0 and log the port they got, so no port is picked
//! that another process may take first), read back from that log; and
//! waiting for a coordinator to serve.

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// The log message of a coordinator's gRPC listener (with `listen=`).
pub const SERVING_GRPC: &str = "serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents";
/// The log message of a coordinator's `/metrics` listener.
pub const SERVING_METRICS: &str = "serving /metrics";
/// The start of the log message of a coordinator's console listener.
pub const SERVING_CONSOLE: &str = "serving the operator console";
/// What `jobfence fake-provider` prints on stdout, followed by its address.
pub const PROVIDER_LISTENING: &str = "listening on";

/// A running child process.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    /// Where this process's output starts in `log` (a restarted process
    /// appends to its predecessor's).
    log_start: u64,
    child: Child,
}

impl Proc {
    /// Starts `program args…` with stdout and stderr appended to
    /// `log_dir/<name>.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Proc> {
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let log_start = file.metadata()?.len();
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Proc {
            name: name.to_owned(),
            log,
            log_start,
            child,
        })
    }

    /// Waits (up to 30 s) for the address this process logged with
    /// `message` (see [`listen_of`]); fails at once if it exited.
    pub async fn listen_addr(&mut self, message: &str) -> Result<SocketAddr> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.output()?;
            if let Some(a) = text.lines().find_map(|l| listen_of(l, message)) {
                return Ok(a);
            }
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited ({status}) before it said where it listens; its log ({}):\n{text}",
                    self.name,
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not log {message:?} within 30 s; see {}",
                    self.name,
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What this process wrote to its log so far.
    fn output(&self) -> Result<String> {
        let mut file = std::fs::File::open(&self.log)
            .with_context(|| format!("reading {}", self.log.display()))?;
        file.seek(SeekFrom::Start(self.log_start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn signal(&self, sig: Signal) -> Result<()> {
        let pid = self
            .child
            .id()
            .with_context(|| format!("{} has already exited", self.name))?;
        kill(Pid::from_raw(pid as i32), sig).with_context(|| format!("{sig} to {}", self.name))
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Freezes the process (it keeps its sockets and in-flight work).
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// Lets a paused process go on.
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// Kills at once, mid-request.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// Asks to stop (SIGTERM) and waits up to `grace`, then kills.
    pub async fn stop(&mut self, grace: Duration) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let _ = self.signal(Signal::SIGCONT);
        self.signal(Signal::SIGTERM)?;
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.kill().await?;
        }
        Ok(())
    }

    /// Has it exited (and how)?
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// The address in a log line that holds `message`: the `listen` field of
/// `jobfence serve`'s log, in its text format (`… message listen=ADDR`) or
/// JSON (`"fields":{"message":…,"listen":"ADDR"}`), or the word right
/// after `message` (the fake provider's `listening on ADDR`).
fn listen_of(line: &str, message: &str) -> Option<SocketAddr> {
    let (_, after) = line.split_once(message)?;
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
        return v["fields"]["listen"].as_str()?.parse().ok();
    }
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .or_else(|| after.split_whitespace().next())
        .and_then(|a| a.trim_matches('"').parse().ok())
}

/// The `JOBFENCE_LOG` of a `jobfence serve` child whose addresses are
/// read from its log: `base` (the filter it would have had), with the info
/// lines of the server and the console let through, which say where they
/// listen.
pub fn serve_log_filter(base: &str) -> String {
    format!("{base},jobfence_server=info,jobfence_console=info")
}

/// Waits (up to 30 s) until the coordinator at `addr` reports SERVING;
/// `credentials` give the TLS to speak (health needs no token).
pub async fn wait_coordinator(
    addr: &str,
    credentials: &jobfence_worker::Credentials,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = credentials
            .endpoint(format!("http://{addr}"))?
            .connect()
            .await
        {
            let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
            let req = tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            };
            if let Ok(r) = health.check(req).await {
                if r.into_inner().status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("the coordinator at {addr} did not become SERVING within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_is_read_from_every_format() {
        let text = "2026-12-01T15:30:45.755Z  INFO jobfence_server: serving jobfence.v1.JobCoordinator, JobAdmin and JobEvents listen=127.0.0.1:41234";
        assert_eq!(
            listen_of(text, SERVING_GRPC),
            Some("127.0.0.1:41234".parse().unwrap())
        );
        assert_eq!(listen_of(text, SERVING_METRICS), None);
        let json = r#"{"timestamp":"…","level":"INFO","fields":{"message":"serving /metrics","listen":"127.0.0.1:9464"},"target":"jobfence_server"}"#;
        assert_eq!(
            listen_of(json, SERVING_METRICS),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        let console = "2026-12-01T15:30:45.755Z  INFO jobfence_console: serving the operator console: it acts as this operator for anyone who can reach its loopback address listen=127.0.0.1:8080 operator=console";
        assert_eq!(
            listen_of(console, SERVING_CONSOLE),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            listen_of("listening on 127.0.0.1:37989", PROVIDER_LISTENING),
            Some("127.0.0.1:37989".parse().unwrap())
        );
    }
}
