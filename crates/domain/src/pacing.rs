//! Pacing background work by what it costs the workers: the decision, as
//! arithmetic over what the store measured. No clock and no database
//! here; the store measures (`jobfence_store::pacing`), this decides how
//! long to rest. The settlement import runs on it; any work done in
//! batches can (the pruner rests a fixed multiple of each batch instead,
//! `--prune-rest`, which keeps the workers above 85 % already:
//! docs/benchmarks.md, "Pruning").
//!
//! Background work runs in batches. While a batch runs, the workers' jobs
//! move at one rate; while the work rests between batches, at another.
//! Both are read from the database the work writes to (the job events
//! committed in each stretch of time, by every coordinator of it), so
//! workers on any coordinator count, not only the one doing the work. Their
//! ratio `k` (0 to 1) says how much a running batch slows the workers: a
//! job working a share `d` of the time leaves them `d·k + (1 − d)` of their
//! rate alone. To leave them [`KEEP`] of it, the work may run
//! `d = (1 − aim) / (1 − k)` of the time, resting `1/d − 1` times as long
//! as each batch took; with `k` at or above the aim it runs flat out, and
//! with nothing else in the database it runs flat out too (there is no one
//! to slow down). A rest is also where the workers' rate alone is measured,
//! so a job working flat out rests now and then for one batch's time (a
//! *probe*), more and more rarely while nothing else runs.

use std::fmt;

/// The share of their rate alone that the workers keep while background
/// work runs (docs/operating.md, "Settlement").
pub const KEEP: f64 = 0.85;

/// What the others did in one stretch of time: job events committed, and
/// how long the stretch lasted (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub events: u64,
    pub seconds: f64,
}

/// How a [`Pacer`] decides. [`PacerSettings::default`] is what the
/// coordinator uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacerSettings {
    /// The share of their rate alone the pacer leaves the workers (0 to
    /// 1): a little above [`KEEP`], since what it measures between two
    /// batches is the workers' rate while the database still writes back
    /// the batch before, below their rate truly alone.
    pub aim: f64,
    /// Seconds after which a measurement of the workers' rates counts
    /// half as much as a new one.
    pub half_life: f64,
    /// The same for whether anything else runs at all: shorter, so that
    /// the work is flat out again soon after the workers stop.
    pub presence_half_life: f64,
    /// Fewer events than this (weighted by the presence half-life), or
    /// fewer a second than [`min_rate`](Self::min_rate), is nothing else
    /// running: a few jobs a second are not held up by the database.
    pub min_events: f64,
    pub min_rate: f64,
    /// The shortest and longest probe, in seconds (a probe rests as long
    /// as the batch before it took, within these).
    pub probe: (f64, f64),
    /// Seconds of work between two probes: the first interval, and the
    /// longest it doubles to while the work is not yielding.
    pub probe_every: (f64, f64),
}

impl Default for PacerSettings {
    fn default() -> Self {
        PacerSettings {
            aim: 0.9,
            half_life: 5.0,
            presence_half_life: 0.5,
            min_events: 10.0,
            min_rate: 20.0,
            probe: (0.02, 1.0),
            probe_every: (1.0, 16.0),
        }
    }
}

/// Why the work rests after a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestKind {
    /// It does not: flat out.
    None,
    /// To measure the workers' rate without the work.
    Probe,
    /// To leave the database to the workers.
    Yield,
}

/// How long to rest after a batch, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rest {
    /// Seconds (0 for [`RestKind::None`]).
    pub seconds: f64,
    pub kind: RestKind,
}

impl Rest {
    const NONE: Rest = Rest {
        seconds: 0.0,
        kind: RestKind::None,
    };
}

/// What the pacer last found, as the work's progress says it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Nothing else makes progress in the database: flat out.
    Alone,
    /// The workers' jobs run `slower` (0 to 1) slower while a batch runs
    /// than without it, little enough to work flat out.
    Unhindered { slower: f64 },
    /// The workers' jobs run `slower` slower while a batch runs, so the
    /// work rests after each batch and works `busy` (0 to 1) of the time.
    Yielding { slower: f64, busy: f64 },
}

impl Pace {
    /// Whether the work rests to leave the database to the workers.
    pub fn yielding(&self) -> bool {
        matches!(self, Pace::Yielding { .. })
    }

    /// A short name for logs and metrics: `alone`, `unhindered`,
    /// `yielding`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Pace::Alone => "alone",
            Pace::Unhindered { .. } => "unhindered",
            Pace::Yielding { .. } => "yielding",
        }
    }

    /// How much slower the workers' jobs run while a batch runs (0 to 1;
    /// 0 when nothing else runs).
    pub fn slower(&self) -> f64 {
        match *self {
            Pace::Alone => 0.0,
            Pace::Unhindered { slower } | Pace::Yielding { slower, .. } => slower,
        }
    }
}

impl fmt::Display for Pace {
    /// e.g. `yielding: the workers' jobs 40 % slower than alone, working
    /// 38 % of the time`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: f64| (x * 100.0).round() as i64;
        match *self {
            Pace::Alone => f.write_str("flat out: nothing else is running"),
            Pace::Unhindered { slower } => write!(
                f,
                "flat out: the workers' jobs {} % slower than alone",
                pct(slower)
            ),
            Pace::Yielding { slower, busy } => write!(
                f,
                "yielding: the workers' jobs {} % slower than alone, working {} % of the time",
                pct(slower),
                pct(busy)
            ),
        }
    }
}

/// Events and seconds, each weighted down by age.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    events: f64,
    seconds: f64,
}

impl Tally {
    fn add(&mut self, w: Window) {
        self.events += w.events as f64;
        self.seconds += w.seconds.max(0.0);
    }

    fn scale(&mut self, f: f64) {
        self.events *= f;
        self.seconds *= f;
    }

    /// Events a second (0 with no time).
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.events / self.seconds
        } else {
            0.0
        }
    }
}

/// The pacing of one run of background work (module docs). Told what
/// happened in each batch ([`worked`](Self::worked)) and each rest
/// ([`rested`](Self::rested)); answers how long to rest.
#[derive(Debug, Clone)]
pub struct Pacer {
    settings: PacerSettings,
    /// The others' progress while batches ran, and between them.
    busy: Tally,
    idle: Tally,
    /// Both together, with the shorter half-life: is anyone there?
    recent: Tally,
    /// Seconds of work since the last rest.
    since_rest: f64,
    /// Seconds of work after which the next probe is due.
    probe_every: f64,
    /// Whether the run has rested at all.
    rested_once: bool,
    pace: Pace,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new(PacerSettings::default())
    }
}

impl Pacer {
    pub fn new(settings: PacerSettings) -> Self {
        Pacer {
            settings,
            busy: Tally::default(),
            idle: Tally::default(),
            recent: Tally::default(),
            since_rest: 0.0,
            probe_every: settings.probe_every.0,
            rested_once: false,
            pace: Pace::Alone,
        }
    }

    /// What the pacer last found.
    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// The share of their rate alone the workers kept while a batch ran,
    /// as measured so far (1 when nothing else runs).
    pub fn kept_while_working(&self) -> f64 {
        1.0 - self.pace.slower()
    }

    fn age(&mut self, seconds: f64) {
        let seconds = seconds.max(0.0);
        let f = 0.5f64.powf(seconds / self.settings.half_life);
        self.busy.scale(f);
        self.idle.scale(f);
        self.recent
            .scale(0.5f64.powf(seconds / self.settings.presence_half_life));
    }

    /// Whether anything else makes progress: it starts at the settings'
    /// minimums and ends below half of them, so a load near them does
    /// not flip the pace at every batch.
    fn present(&self) -> bool {
        let s = &self.settings;
        let (events, rate) = (self.recent.events, self.recent.rate());
        if self.pace == Pace::Alone {
            events >= s.min_events && rate >= s.min_rate
        } else {
            events >= s.min_events / 2.0 && rate >= s.min_rate / 2.0
        }
    }

    /// A probe after a batch of `seconds`; `grow`: the next one comes
    /// twice as late.
    fn probe(&mut self, seconds: f64, grow: bool) -> Rest {
        let (low, high) = self.settings.probe;
        if grow {
            self.probe_every = (self.probe_every * 2.0).min(self.settings.probe_every.1);
        }
        Rest {
            seconds: seconds.clamp(low, high),
            kind: RestKind::Probe,
        }
    }

    /// A batch ran for `w.seconds` while the others made `w.events`: how
    /// long to rest before the next one.
    pub fn worked(&mut self, w: Window) -> Rest {
        self.age(w.seconds);
        self.busy.add(w);
        self.recent.add(w);
        self.since_rest += w.seconds.max(0.0);
        let due = self.since_rest >= self.probe_every;
        if !self.present() {
            // What was measured of workers who have gone says nothing of
            // the next ones.
            self.busy = Tally::default();
            self.idle = Tally::default();
            self.pace = Pace::Alone;
            // A batch may stop the workers outright, so that nothing moves
            // while it runs: the first rest of a run, and the probes,
            // would show them.
            return if due || !self.rested_once {
                self.probe(w.seconds, true)
            } else {
                Rest::NONE
            };
        }
        if self.idle.seconds <= 0.0 {
            // Others run, and nothing says what they make without the
            // work: find out now.
            return self.probe(w.seconds, false);
        }
        let s = self.settings;
        let alone = self.idle.rate();
        let kept = if alone > 0.0 {
            (self.busy.rate() / alone).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let slower = 1.0 - kept;
        if kept >= s.aim {
            self.pace = Pace::Unhindered { slower };
            return if due {
                self.probe(w.seconds, true)
            } else {
                Rest::NONE
            };
        }
        let busy = ((1.0 - s.aim) / slower).min(1.0);
        self.pace = Pace::Yielding { slower, busy };
        self.probe_every = s.probe_every.0;
        Rest {
            seconds: w.seconds.max(0.0) * (1.0 / busy - 1.0),
            kind: RestKind::Yield,
        }
    }

    /// The work rested (or waited for its next batch) for `w.seconds`
    /// while the others made `w.events`.
    pub fn rested(&mut self, w: Window) {
        self.age(w.seconds);
        self.idle.add(w);
        self.recent.add(w);
        self.since_rest = 0.0;
        self.rested_once = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(events: u64, seconds: f64) -> Window {
        Window { events, seconds }
    }

    /// Runs `batches` batches of `batch` seconds against workers making
    /// `alone` events a second without the work and `kept` times that
    /// while a batch runs; what the workers made over the whole run as a
    /// share of their rate alone, the share of time worked, and the pacer.
    fn simulate(alone: f64, kept: f64, batch: f64, batches: usize) -> (f64, f64, Pacer) {
        let mut p = Pacer::default();
        let (mut made, mut worked, mut total) = (0.0, 0.0, 0.0);
        for _ in 0..batches {
            let during = (alone * kept * batch).round() as u64;
            let rest = p.worked(w(during, batch));
            made += during as f64;
            worked += batch;
            total += batch;
            if rest.seconds > 0.0 {
                let between = (alone * rest.seconds).round() as u64;
                p.rested(w(between, rest.seconds));
                made += between as f64;
                total += rest.seconds;
            }
        }
        (made / (alone * total), worked / total, p)
    }

    #[test]
    fn the_first_batch_is_followed_by_a_probe_as_long_as_it() {
        let mut p = Pacer::default();
        let rest = p.worked(w(0, 0.06));
        assert_eq!(rest.kind, RestKind::Probe);
        assert!((rest.seconds - 0.06).abs() < 1e-12);
        // A tiny batch probes for the shortest probe, a long one the longest.
        assert_eq!(Pacer::default().worked(w(0, 0.001)).seconds, 0.02);
        assert_eq!(Pacer::default().worked(w(0, 5.0)).seconds, 1.0);
    }

    #[test]
    fn alone_it_works_flat_out_probing_more_and_more_rarely() {
        let mut p = Pacer::default();
        let mut probes = Vec::new();
        let mut worked = 0.0;
        for _ in 0..1000 {
            let rest = p.worked(w(0, 0.05));
            worked += 0.05;
            assert_ne!(rest.kind, RestKind::Yield);
            if rest.kind == RestKind::Probe {
                probes.push(worked);
                p.rested(w(0, rest.seconds));
            }
            assert_eq!(p.pace(), Pace::Alone);
        }
        // 50 s of work: after the first batch, then after 2, 4, 8, 16 and
        // 16 s more of work.
        assert!((5..=7).contains(&probes.len()), "{probes:?}");
        let probed: f64 = probes.len() as f64 * 0.05;
        assert!(probed / worked < 0.01, "probes took {probed} s of {worked}");
    }

    #[test]
    fn a_few_stray_events_are_nothing_else_running() {
        let mut p = Pacer::default();
        p.worked(w(0, 0.05));
        p.rested(w(3, 0.05));
        assert_eq!(p.worked(w(2, 0.05)).kind, RestKind::None);
        assert_eq!(p.pace(), Pace::Alone);
    }

    #[test]
    fn workers_slowed_by_a_batch_make_it_yield_so_they_keep_85_percent() {
        // 40 % slower while a batch runs: the work may run a quarter of
        // the time (aiming at 90 %), resting three batches' time.
        let mut p = Pacer::default();
        p.worked(w(600, 0.1));
        p.rested(w(1000, 0.1));
        let rest = p.worked(w(600, 0.1));
        assert_eq!(rest.kind, RestKind::Yield);
        assert!((rest.seconds - 0.3).abs() < 1e-9, "{rest:?}");
        let Pace::Yielding { slower, busy } = p.pace() else {
            panic!("{:?}", p.pace())
        };
        assert!((slower - 0.4).abs() < 1e-9 && (busy - 0.25).abs() < 1e-9);
        assert_eq!(
            p.pace().to_string(),
            "yielding: the workers' jobs 40 % slower than alone, working 25 % of the time"
        );
    }

    #[test]
    fn whatever_a_batch_costs_the_workers_keep_their_share_over_a_run() {
        for kept in [0.0, 0.1, 0.3, 0.5, 0.62, 0.69, 0.8, 0.88, 0.95, 1.0] {
            let (share, worked, p) = simulate(8000.0, kept, 0.08, 2000);
            assert!(
                share >= KEEP,
                "a batch keeping {kept}: the workers kept {share} (worked {worked}, {:?})",
                p.pace()
            );
            // And it works no less than that allows (a probe's worth).
            let most = if kept >= 0.9 { 1.0 } else { 0.1 / (1.0 - kept) };
            assert!(
                worked >= most * 0.93,
                "a batch keeping {kept}: worked {worked} of the time, could {most}"
            );
        }
    }

    #[test]
    fn workers_a_batch_does_not_slow_leave_it_flat_out() {
        let (share, worked, p) = simulate(5000.0, 0.95, 0.05, 1000);
        assert!(share > 0.94);
        assert!(worked > 0.97, "{worked}");
        assert_eq!(p.pace().as_str(), "unhindered");
        assert_eq!(
            p.pace().to_string(),
            "flat out: the workers' jobs 5 % slower than alone"
        );
    }

    #[test]
    fn workers_stopped_by_a_batch_still_leave_it_a_tenth_of_the_time() {
        let mut p = Pacer::default();
        p.worked(w(0, 0.1));
        p.rested(w(500, 0.1));
        let rest = p.worked(w(0, 0.1));
        assert_eq!(rest.kind, RestKind::Yield);
        assert!((rest.seconds - 0.9).abs() < 1e-9, "{rest:?}");
        assert_eq!(p.kept_while_working(), 0.0);
    }

    #[test]
    fn workers_who_arrive_later_are_found_by_the_next_probe_and_yielded_to() {
        let mut p = Pacer::default();
        let mut batches = 0;
        // Alone for 10 s of work: the probe interval has grown to 8 s.
        while batches < 200 {
            if p.worked(w(0, 0.05)).kind == RestKind::Probe {
                p.rested(w(0, 0.05));
            }
            batches += 1;
        }
        // Workers arrive that a batch slows by half: their events while
        // a batch runs say others are there, and the first probe shows
        // what they would make alone.
        let mut yielded_after = None;
        for n in 0..400 {
            let rest = p.worked(w(20, 0.05));
            if rest.kind != RestKind::None {
                p.rested(w(40, rest.seconds));
            }
            if rest.kind == RestKind::Yield {
                yielded_after = Some(n);
                break;
            }
        }
        // The first batch they slow says they are there: a probe at once,
        // and the next batch yields.
        let n = yielded_after.expect("never yielded");
        assert_eq!(n, 1, "yielded only after {n} batches");
        assert!(p.pace().yielding());
    }

    #[test]
    fn the_measure_ages_so_workers_who_leave_are_let_go() {
        let (_, _, mut p) = simulate(8000.0, 0.4, 0.08, 200);
        assert!(p.pace().yielding());
        // The workers stop: rests and batches see nothing; within a few
        // half-lives the work is flat out again.
        let mut flat_out_after = None;
        for n in 0..2000 {
            let rest = p.worked(w(0, 0.08));
            if rest.seconds > 0.0 {
                p.rested(w(0, rest.seconds));
            }
            if p.pace() == Pace::Alone {
                flat_out_after = Some(n);
                break;
            }
        }
        assert!(flat_out_after.is_some(), "{:?}", p.pace());
    }

    #[test]
    fn paces_read_as_the_progress_line_says_them() {
        assert_eq!(Pace::Alone.to_string(), "flat out: nothing else is running");
        assert!(!Pace::Alone.yielding());
        assert_eq!(Pace::Alone.slower(), 0.0);
        let y = Pace::Yielding {
            slower: 0.4,
            busy: 0.38,
        };
        assert!(y.yielding());
        assert_eq!(y.as_str(), "yielding");
    }
}
