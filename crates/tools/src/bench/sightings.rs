//! What the workers view costs a call (docs/operating.md "Workers"): the
//! coordinator notes each call that names a worker in an in-memory map
//! ([`Sightings::saw`]); timed here in-process, on two threads over 64
//! worker ids, as the run's coordinator phases call it. Its write (one
//! statement every 5 s per coordinator) is not on any call's path.

use jobfence_core::workers::Sightings;
use std::sync::Arc;
use std::time::Instant;

/// Calls timed per thread.
const CALLS: u32 = 2_000_000;

/// Mean nanoseconds per [`Sightings::saw`], two threads at once.
pub(super) fn ns_per_call() -> f64 {
    let sightings = Arc::new(Sightings::new("bench".into()));
    let ids: Arc<Vec<String>> = Arc::new((0..64).map(|i| format!("bench-w{i}")).collect());
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (s, ids) = (sightings.clone(), ids.clone());
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    let id = &ids[(i as usize * 2 + t) % ids.len()];
                    s.saw(id, "bench", "jobfence-rust/0.1.0");
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    // Two threads ran at once: the wall time is each one's calls' time.
    started.elapsed().as_nanos() as f64 / f64::from(CALLS)
}
