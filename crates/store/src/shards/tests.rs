//! Unit tests of the shards file and of ids that name their database.

use super::*;

#[test]
fn ids_name_their_database() {
    assert_eq!(shard_of(1), 0);
    assert_eq!(shard_of(range_start(1) + 1), 1);
    assert_eq!(shard_of(range_start(2) - 1), 1);
    assert!(range_start(MAX_SHARDS) <= 1 << 53);
}

#[test]
fn an_exact_name_beats_the_longest_prefix_which_beats_the_default() {
    let c = ShardsConfig::parse(
        "# two databases\n\
         database 0 mysql://a/x\n\
         database 1 mysql://b/x,mysql://c/x\n\
         queue payouts-eu 0\n\
         prefix pay 0\n\
         prefix payouts- 1  # longer\n\
         default 0\n",
    )
    .unwrap();
    assert_eq!(c.databases[&1], ["mysql://b/x", "mysql://c/x"]);
    let p = &c.placement;
    assert_eq!(p.shard_for("payouts-eu"), Some(0));
    assert_eq!(p.shard_for("payouts-us"), Some(1));
    assert_eq!(p.shard_for("payments"), Some(0));
    assert_eq!(p.shard_for("refunds"), Some(0));
}

#[test]
fn a_file_with_a_mistake_is_refused_with_its_line() {
    let bad = [
        ("database 0 mysql://a/x\nqueue refunds 1\n", "database 1"),
        ("database 0 mysql://a/x\ndatabase 0 mysql://b/x\n", "line 2"),
        ("database 32 mysql://a/x\n", "from 0 to 31"),
        ("database 0 mysql://a/x\nqueue refunds\n", "line 2"),
        ("# nothing\n", "no database"),
    ];
    for (text, says) in bad {
        let err = ShardsConfig::parse(text).unwrap_err();
        assert!(err.contains(says), "{err:?} should say {says:?}");
    }
    let none = ShardsConfig::parse("database 0 mysql://a/x\nqueue refunds 0\n").unwrap();
    assert_eq!(none.placement.shard_for("payouts"), None);
}
