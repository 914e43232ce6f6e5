//! Knowing, without a sleep, that a competing call is blocked on a row
//! lock: the deterministic half of a race test (pause the first call
//! holding its locks, start the second, wait until InnoDB says the second
//! waits, release the first).
//!
//! InnoDB's `information_schema.INNODB_TRX` cannot tell this reliably: it
//! is a snapshot refreshed only when nobody read it for 100 ms, so while
//! other tests of the same server poll it (they run in parallel), one
//! test's answer can stay stale for as long as they keep reading. `SHOW
//! ENGINE INNODB STATUS` is built afresh on every call: each transaction
//! that waits says `LOCK WAIT`, and the lock it waits for names its table
//! as `` `database`.`table` ``, so a test finds the waits of its own
//! database among everyone's. MySQL and MariaDB print it alike.

use sqlx::mysql::MySqlPool;
use std::time::Duration;

/// How many transactions wait for a lock on a table of database `db` now.
pub async fn lock_waits(pool: &MySqlPool, db: &str) -> usize {
    let row: (Vec<u8>, Vec<u8>, Vec<u8>) = sqlx::query_as("SHOW ENGINE INNODB STATUS")
        .fetch_one(pool)
        .await
        .expect("SHOW ENGINE INNODB STATUS (the test user needs PROCESS)");
    let status = String::from_utf8_lossy(&row.2);
    waits_in(&status, db)
}

/// The transactions of an InnoDB status report that wait for a lock of
/// database `db`.
fn waits_in(status: &str, db: &str) -> usize {
    let table = format!("`{db}`.");
    status
        .split("---TRANSACTION ")
        .skip(1)
        .filter(|trx| trx.contains("LOCK WAIT") && trx.contains(&table))
        .count()
}

/// Waits until at least one transaction of database `db` waits for a lock
/// (checked every 5 ms); panics after 60 s with what InnoDB reported.
pub async fn until_lock_wait(pool: &MySqlPool, db: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while lock_waits(pool, db).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no transaction of {db} ever waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waits_on_the_tests_own_database_count() {
        let status = "\
LIST OF TRANSACTIONS FOR EACH SESSION:
---TRANSACTION (0x7ff8), ACTIVE 1 sec starting index read
LOCK WAIT 2 lock struct(s), heap size 1128, 1 row lock(s)
MariaDB thread id 14, OS thread handle 1, query id 40 127.0.0.1 jobfence Statistics
------- TRX HAS BEEN WAITING 1005039 us FOR THIS LOCK TO BE GRANTED:
RECORD LOCKS space id 6 page no 3 n bits 320 index PRIMARY of table `jf_test_1`.`jobs` trx id 0 lock mode S locks rec but not gap waiting
---TRANSACTION 30, ACTIVE 1 sec
2 lock struct(s), heap size 1128, 1 row lock(s)
RECORD LOCKS space id 6 page no 3 n bits 320 index PRIMARY of table `jf_test_1`.`jobs` trx id 30 lock_mode X locks rec but not gap
---TRANSACTION 31, ACTIVE 1 sec starting index read
LOCK WAIT 2 lock struct(s), heap size 1128, 1 row lock(s)
RECORD LOCKS space id 7 page no 3 n bits 320 index PRIMARY of table `jf_test_12`.`jobs` trx id 31 lock_mode X waiting
--------
FILE I/O";
        assert_eq!(waits_in(status, "jf_test_1"), 1);
        assert_eq!(waits_in(status, "jf_test_12"), 1);
        assert_eq!(waits_in(status, "jf_test_2"), 0);
    }
}
