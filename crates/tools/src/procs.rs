//! Child processes of the demo and the benchmark: started with their
//! output in a log file, paused (SIGSTOP), resumed (SIGCONT), killed
//! (SIGKILL) or stopped (SIGTERM) on purpose; and waiting for a
//! coordinator to serve.

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A running child process.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
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
            child,
        })
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

/// A free TCP port on loopback (bind to 0, read it, release it).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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
