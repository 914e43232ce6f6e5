//! The benchmark keeps working: a short run of `jobfence bench` (a few
//! hundred jobs, every phase, the finished-rows, pruning, backlog and
//! bulk repair phases included) against the test database must check every phase and
//! write its report. It asserts nothing about the figures: that is the
//! benchmark's job, not a test's.

use jobfence_testkit as kit;

use std::process::Command;

#[test]
fn a_short_benchmark_run_checks_every_phase_and_writes_its_report() {
    let base = kit::base_url();
    let (server, _) = base.rsplit_once('/').unwrap();
    let db = format!("jf_test_{}_bench", std::process::id());
    let dir = std::env::temp_dir().join(format!("jobfence-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("benchmarks.md");
    let out = Command::new(env!("CARGO_BIN_EXE_jobfence"))
        .args([
            "bench",
            "--database-url",
            &format!("{server}/{db}"),
            "--jobs",
            "200",
            "--workers",
            "1,4",
            "--claim-batch",
            "8",
            "--enqueue-jobs",
            "400",
            "--enqueue-batch",
            "50",
            "--finished-rows",
            "3000",
            "--prune-rows",
            "3000",
            "--prune-rounds",
            "1",
            "--settle-lines",
            "3000",
            "--bulk-jobs",
            "2000",
            "--bulk-batch",
            "100,500",
            "--bulk-workers",
            "4",
            "--fairness-keys",
            "50",
            "--key-backlog",
            "3000",
            "--budget-rate",
            "40",
            "--budget-seconds",
            "2",
            "--compare-reference-index",
            // The real benchmark waits for InnoDB to settle; on the shared
            // test server the other tests keep it busy, so the wait would
            // only run out its two minutes.
            "--settle-seconds",
            "0",
            "--log-dir",
        ])
        .arg(dir.join("logs"))
        .arg("--write")
        .arg(&report)
        .output()
        .expect("run jobfence bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed\n{stdout}\n{stderr}");
    // Every lifecycle phase was checked: 2 worker counts × 8 (direct,
    // Claim(1), the next job on Complete with and without the provider
    // reference's index, the direct SQL and both loops under the budget
    // far above the load, Claim(8)), the next job on Complete over jobs
    // with fairness keys at 4 workers, the ceiling, and the finished-rows
    // phase;
    // and the paced phase handed out nothing twice.
    let checked = stderr
        .lines()
        .filter(|l| l.contains("checked: 200 jobs succeeded once"))
        .count();
    assert_eq!(checked, 19, "{stderr}");
    // Each claim of the backlog phase took the key's oldest job.
    assert_eq!(
        stderr
            .matches("checked: each claim took the key's oldest job")
            .count(),
        2,
        "{stderr}"
    );
    assert_eq!(
        stderr
            .matches("against a budget of 40/s (burst 4; checked: none twice)")
            .count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("checked: 400 jobs in the table").count(),
        4,
        "{stderr}"
    );
    let md = std::fs::read_to_string(&report).unwrap();
    for needle in [
        "| direct SQL lifecycle | 4 |",
        "| coordinator, Claim(1) | 4 |",
        "| coordinator, Claim(8) | 1 |",
        "enqueue: EnqueueBatch(50)",
        "3000 finished rows",
        "| coordinator, Claim(1), budget far above the load | 4 |",
        "| coordinator, Complete hands the next job | 1 |",
        "| coordinator, Complete hands the next job, budget far above | 4 |",
        "| coordinator, Complete hands the next job, 50 fairness keys | 4 |",
        "| coordinator, Complete hands the next job, no reference index | 4 |",
        "| enqueue: Enqueue RPC, no reference index | 16 |",
        "Next job on Complete, 4 workers: with the provider reference's index × without it",
        "## One claim against one key's backlog",
        "| 1000 | ",
        "| 3000 | ",
        "budget 40/s (burst 4) below the load",
        "innodb_flush_log_at_trx_commit: 1",
        "## Targets",
        "## Pruning",
        "3000 finished jobs (one completion event each)",
        "| while pruning |",
        "| operation_keys | 0 |",
        "## Settlement import",
        "| while importing |",
        "| the import beside them |",
        "| the import alone |",
        "## Repair in bulk",
        "2000 ready jobs of a queue of their own",
        "| bulk | bulk s | bulk jobs/s |",
        "| batch 100, flat out | ",
        "| batch 500, flat out | ",
    ] {
        assert!(md.contains(needle), "no {needle:?} in\n{md}");
    }
    assert!(stdout.contains("coordinator ≥ 3× direct"), "{stdout}");
    assert!(stdout.contains("within 10% of no budget"), "{stdout}");
    assert!(
        stdout.contains("jobs across 50 fairness keys: ≥ 90% of the same without keys"),
        "{stdout}"
    );
    assert!(
        stdout.contains("next job on Complete, 1 worker: ≥ 0.8× direct"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
