//! Whether the database keeps an acknowledged commit through a crash
//! (docs/design.md rule 9), as a pure function of the settings the server reports.
//!
//! The fence rests on one fact: once a Claim or Takeover has committed
//! attempt N, no later claim hands out N again. If the server acknowledges
//! that commit and then loses it in a crash, the row is back at attempt N-1
//! and the next claim hands out N a second time, to another worker, while
//! the first one still holds it.

use std::fmt;

/// The server settings that decide whether an acknowledged commit survives
/// a crash, as the text the server reports (`SHOW GLOBAL VARIABLES`); `None`
/// when the server does not have the setting (`wsrep_*` on MySQL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurabilitySettings {
    /// `innodb_flush_log_at_trx_commit`: `1` (and MariaDB's `3`) flush the
    /// redo log to disk at every commit; `2` writes it at commit and flushes
    /// it about once a second; `0` does both about once a second.
    pub innodb_flush_log_at_trx_commit: Option<String>,
    /// `log_bin`: whether the binary log is on (`ON`/`OFF`).
    pub log_bin: Option<String>,
    /// `sync_binlog`: the binary log is flushed to disk every this many
    /// commit groups; `0` leaves it to the operating system.
    pub sync_binlog: Option<String>,
    /// `wsrep_on`: whether Galera replication is on (MariaDB only).
    pub wsrep_on: Option<String>,
    /// `wsrep_provider_options`: Galera's `key = value; …` options, of which
    /// `pc.ignore_sb` and `pc.ignore_quorum` matter here.
    pub wsrep_provider_options: Option<String>,
}

/// One setting that lets an acknowledged commit be lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurabilityRisk {
    /// The server variable, e.g. `innodb_flush_log_at_trx_commit`.
    pub setting: &'static str,
    /// Its value as the server reported it (`(absent)` if not reported).
    pub value: String,
    /// What it risks, in one sentence.
    pub risk: String,
}

impl fmt::Display for DurabilityRisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}: {}", self.setting, self.value, self.risk)
    }
}

/// The verdict on one reading of the settings: durable when `risks` is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Durability {
    /// The settings the verdict is about.
    pub settings: DurabilitySettings,
    /// Every setting that can lose an acknowledged commit, in a fixed order.
    pub risks: Vec<DurabilityRisk>,
}

impl Durability {
    /// True when no setting lets an acknowledged commit be lost.
    pub fn is_durable(&self) -> bool {
        self.risks.is_empty()
    }

    /// The settings that were read and matter, as `name=value` pairs, e.g.
    /// `innodb_flush_log_at_trx_commit=1, log_bin=OFF` (`sync_binlog` only
    /// with the binary log on, the Galera ones only on Galera).
    pub fn summary(&self) -> String {
        let s = &self.settings;
        let mut parts = vec![format!(
            "innodb_flush_log_at_trx_commit={}",
            shown(&s.innodb_flush_log_at_trx_commit)
        )];
        if let Some(log_bin) = &s.log_bin {
            parts.push(format!("log_bin={log_bin}"));
            if is_on(log_bin) {
                parts.push(format!("sync_binlog={}", shown(&s.sync_binlog)));
            }
        }
        if s.wsrep_on.as_deref().is_some_and(is_on) {
            parts.push("wsrep_on=ON".to_owned());
            for (key, _) in GALERA_SPLIT_BRAIN_OPTIONS {
                if let Some(v) = provider_option(s, key) {
                    parts.push(format!("{key}={v}"));
                }
            }
        }
        parts.join(", ")
    }
}

/// Galera provider options that let a partitioned cluster keep committing
/// on both sides, and the name a risk reports them by.
const GALERA_SPLIT_BRAIN_OPTIONS: [(&str, &str); 2] = [
    ("pc.ignore_sb", "wsrep_provider_options pc.ignore_sb"),
    (
        "pc.ignore_quorum",
        "wsrep_provider_options pc.ignore_quorum",
    ),
];

const ABSENT: &str = "(absent)";

fn shown(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or(ABSENT)
}

fn is_on(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_uppercase().as_str(),
        "ON" | "1" | "TRUE" | "YES"
    )
}

/// The value of `key` in Galera's `wsrep_provider_options`.
fn provider_option<'a>(s: &'a DurabilitySettings, key: &str) -> Option<&'a str> {
    s.wsrep_provider_options
        .as_deref()?
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim())
}

/// Decides which of `settings` let an acknowledged commit be lost, and what
/// each one risks (docs/design.md rule 9: the database commits durably; on
/// replication, only synchronous or certified commits count).
///
/// - `innodb_flush_log_at_trx_commit` must be `1` (or MariaDB's `3`); a value
///   the server does not report, or does not document, is a risk too: the
///   fence cannot be shown to hold.
/// - With the binary log on, `sync_binlog` must be `1`: InnoDB's crash
///   recovery trusts the binary log, so a commit missing from it is rolled
///   back.
/// - On Galera, the cluster certifies every commit synchronously, which
///   narrows what a lazy flush risks to a crash of every node at once; it is
///   still reported (rule 9 asks for the flush too). `pc.ignore_sb` or
///   `pc.ignore_quorum` set to true let both sides of a partition commit.
pub fn assess(settings: DurabilitySettings) -> Durability {
    let galera = settings.wsrep_on.as_deref().is_some_and(is_on);
    let mut risks: Vec<DurabilityRisk> = [flush_risk(&settings, galera), binlog_risk(&settings)]
        .into_iter()
        .flatten()
        .collect();
    if galera {
        risks.extend(split_brain_risks(&settings));
    }
    Durability { settings, risks }
}

/// What `innodb_flush_log_at_trx_commit` risks, if anything: `1` (or
/// MariaDB's `3`) flushes every commit; an unreported or undocumented value
/// cannot be shown to.
fn flush_risk(settings: &DurabilitySettings, galera: bool) -> Option<DurabilityRisk> {
    let lost_window = if galera {
        "; Galera's certification keeps them on the other nodes, so they are lost only \
         when every node of the cluster crashes within that second (a shared power loss)"
    } else {
        ""
    };
    let flush = settings.innodb_flush_log_at_trx_commit.as_deref();
    let risk = match flush.map(str::trim) {
        Some("1" | "3") => None,
        Some("2") => Some(format!(
            "the redo log is written at commit but flushed to disk only about once a \
             second, so a power loss or operating-system crash loses the commits of that \
             last second{lost_window}"
        )),
        Some("0") => Some(format!(
            "the redo log is written and flushed only about once a second, so even a \
             crash of the database process loses the commits of that last \
             second{lost_window}"
        )),
        Some(_) => Some(
            "not a documented value, so whether a commit is on disk when it is \
             acknowledged is unknown"
                .to_owned(),
        ),
        None => Some(
            "not reported by the server, so whether a commit is on disk when it is \
             acknowledged is unknown"
                .to_owned(),
        ),
    }?;
    Some(DurabilityRisk {
        setting: "innodb_flush_log_at_trx_commit",
        value: shown(&settings.innodb_flush_log_at_trx_commit).to_owned(),
        risk,
    })
}

/// What `sync_binlog` risks with the binary log on, if anything: InnoDB's
/// crash recovery trusts the binary log, so a commit missing from it is
/// rolled back.
fn binlog_risk(settings: &DurabilitySettings) -> Option<DurabilityRisk> {
    if !settings.log_bin.as_deref().is_some_and(is_on) {
        return None;
    }
    let sync = settings.sync_binlog.as_deref().map(str::trim);
    let recovery = "which crash recovery then rolls back (InnoDB trusts the binary log) \
                    and replicas never receive";
    let risk = match sync.map(str::parse::<u64>) {
        Some(Ok(1)) => None,
        Some(Ok(0)) => Some(format!(
            "the binary log is flushed to disk only when the operating system decides, \
             so after a power loss or operating-system crash it can lack acknowledged \
             commits, {recovery}"
        )),
        Some(Ok(n)) => Some(format!(
            "the binary log is flushed to disk every {n} commit groups, so after a power \
             loss or operating-system crash it can lack the last {} groups of acknowledged \
             commits, {recovery}",
            n - 1
        )),
        Some(Err(_)) | None => Some(
            "not reported as a number, so whether the binary log holds every acknowledged \
             commit after a crash is unknown"
                .to_owned(),
        ),
    }?;
    Some(DurabilityRisk {
        setting: "sync_binlog",
        value: shown(&settings.sync_binlog).to_owned(),
        risk,
    })
}

/// The Galera options that let both sides of a partition commit
/// (`pc.ignore_sb`, `pc.ignore_quorum` set to true).
fn split_brain_risks(settings: &DurabilitySettings) -> Vec<DurabilityRisk> {
    GALERA_SPLIT_BRAIN_OPTIONS
        .into_iter()
        .filter_map(|(key, setting)| {
            let v = provider_option(settings, key).filter(|v| is_on(v))?;
            Some(DurabilityRisk {
                setting,
                value: v.to_owned(),
                risk: "both sides of a network partition keep committing, so each can \
                       hand out the same attempt, and one side's commits are discarded \
                       when the cluster is merged again"
                    .to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(flush: &str, log_bin: &str, sync_binlog: &str) -> DurabilitySettings {
        DurabilitySettings {
            innodb_flush_log_at_trx_commit: Some(flush.into()),
            log_bin: Some(log_bin.into()),
            sync_binlog: Some(sync_binlog.into()),
            wsrep_on: Some("OFF".into()),
            wsrep_provider_options: Some(String::new()),
        }
    }

    fn risky(d: &Durability) -> Vec<(&'static str, &str)> {
        d.risks
            .iter()
            .map(|r| (r.setting, r.value.as_str()))
            .collect()
    }

    #[test]
    fn flushing_the_redo_log_at_every_commit_is_durable() {
        for flush in ["1", "3"] {
            let d = assess(settings(flush, "OFF", "0"));
            assert!(d.is_durable(), "{flush}: {:?}", d.risks);
        }
        let d = assess(settings("1", "OFF", "0"));
        assert_eq!(d.summary(), "innodb_flush_log_at_trx_commit=1, log_bin=OFF");
    }

    #[test]
    fn a_lazy_redo_log_flush_can_lose_the_last_second_of_commits() {
        let d = assess(settings("2", "OFF", "0"));
        assert!(!d.is_durable());
        assert_eq!(risky(&d), [("innodb_flush_log_at_trx_commit", "2")]);
        assert!(d.risks[0].risk.contains("power loss"), "{}", d.risks[0]);
        let d = assess(settings("0", "OFF", "0"));
        assert_eq!(risky(&d), [("innodb_flush_log_at_trx_commit", "0")]);
        assert!(
            d.risks[0].risk.contains("database process"),
            "{}",
            d.risks[0]
        );
    }

    #[test]
    fn an_unknown_redo_log_setting_is_not_taken_as_durable() {
        let d = assess(DurabilitySettings::default());
        assert_eq!(risky(&d), [("innodb_flush_log_at_trx_commit", ABSENT)]);
        let d = assess(settings("7", "OFF", "0"));
        assert_eq!(risky(&d), [("innodb_flush_log_at_trx_commit", "7")]);
    }

    #[test]
    fn with_the_binary_log_on_it_must_be_synced_at_every_commit() {
        assert!(assess(settings("1", "ON", "1")).is_durable());
        let d = assess(settings("1", "ON", "0"));
        assert_eq!(risky(&d), [("sync_binlog", "0")]);
        assert!(d.risks[0].risk.contains("rolls back"), "{}", d.risks[0]);
        let d = assess(settings("1", "ON", "100"));
        assert_eq!(risky(&d), [("sync_binlog", "100")]);
        assert!(d.risks[0].risk.contains("last 99 groups"), "{}", d.risks[0]);
        assert_eq!(
            d.summary(),
            "innodb_flush_log_at_trx_commit=1, log_bin=ON, sync_binlog=100"
        );
        let d = assess(settings("2", "ON", "0"));
        assert_eq!(
            risky(&d),
            [
                ("innodb_flush_log_at_trx_commit", "2"),
                ("sync_binlog", "0")
            ]
        );
    }

    #[test]
    fn sync_binlog_does_not_matter_without_a_binary_log() {
        assert!(assess(settings("1", "OFF", "0")).is_durable());
    }

    #[test]
    fn on_galera_a_lazy_flush_is_still_reported_with_what_it_narrows_to() {
        let mut s = settings("2", "OFF", "0");
        s.wsrep_on = Some("ON".into());
        let d = assess(s);
        assert_eq!(risky(&d), [("innodb_flush_log_at_trx_commit", "2")]);
        assert!(d.risks[0].risk.contains("every node"), "{}", d.risks[0]);
        assert!(d.summary().ends_with("wsrep_on=ON"), "{}", d.summary());
    }

    #[test]
    fn on_galera_ignoring_split_brain_is_a_risk() {
        let mut s = settings("1", "OFF", "0");
        s.wsrep_on = Some("ON".into());
        s.wsrep_provider_options = Some(
            "evs.delayed_keep_period = PT30S; pc.ignore_sb = true; pc.ignore_quorum = false".into(),
        );
        let d = assess(s.clone());
        assert_eq!(risky(&d), [("wsrep_provider_options pc.ignore_sb", "true")]);
        // The same options without Galera on are not in effect.
        s.wsrep_on = Some("OFF".into());
        assert!(assess(s).is_durable());
    }
}
