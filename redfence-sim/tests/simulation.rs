//! The simulation's own tests: every regression seed passes, a seed replays its trace
//! exactly, the planted bugs are found (proof that the checkers can fail), and a first batch
//! of seeds passes. CI runs 5,000 more seeds with the release build (scripts/test.sh).

use redfence::testing::{Plant, Profile};
use redfence_sim::{Options, run_seed};

/// The regression seeds of `regressions.txt`, with their profile if one is named.
fn regressions() -> Vec<(u64, Option<Profile>)> {
    include_str!("../regressions.txt")
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let seed = words.next()?.parse().ok()?;
            let profile = match words.next() {
                Some("redis7") => Some(Profile::Redis7),
                Some("valkey9") => Some(Profile::Valkey9),
                Some("redis8") => Some(Profile::Redis8),
                Some(other) => panic!("regressions.txt: unknown profile {other}"),
                None => None,
            };
            Some((seed, profile))
        })
        .collect()
}

#[test]
fn every_regression_seed_passes() {
    let seeds = regressions();
    assert!(seeds.len() >= 8, "regressions.txt lost seeds: {seeds:?}");
    for (seed, profile) in seeds {
        let outcome = run_seed(
            seed,
            Options {
                profile,
                ..Options::default()
            },
        );
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
        assert!(outcome.grants > 0, "seed {seed} granted nothing");
    }
}

#[test]
fn a_seed_replays_its_trace_exactly() {
    let traced = Options {
        trace: true,
        ..Options::default()
    };
    let first = run_seed(11, traced);
    let second = run_seed(11, traced);
    assert!(
        first.trace.len() > 100,
        "a short trace: {}",
        first.trace.len()
    );
    assert_eq!(first.trace, second.trace);
    // Another seed is another run.
    assert_ne!(run_seed(12, traced).trace, first.trace);
}

/// Runs `seed` with `plant` and without: the plant's violations, and the clean run's.
fn planted(seed: u64, plant: Plant) -> (Vec<String>, Vec<String>) {
    let with = run_seed(
        seed,
        Options {
            plant: Some(plant),
            ..Options::default()
        },
    );
    (
        with.violations,
        run_seed(seed, Options::default()).violations,
    )
}

#[test]
fn a_release_overtaking_its_acquire_is_found() {
    let (with, without) = planted(35, Plant::ReleaseOvertakesAcquire);
    assert!(
        with.iter()
            .any(|v| v.contains("after its release had run there")),
        "{with:?}"
    );
    assert!(without.is_empty(), "{without:?}");
}

#[test]
fn a_failed_shortening_extension_that_keeps_the_old_expiry_is_found() {
    let (with, without) = planted(288, Plant::ShorteningExtend);
    assert!(with.iter().any(|v| v.contains("two holders")), "{with:?}");
    assert!(without.is_empty(), "{without:?}");
}

#[test]
fn the_first_seeds_pass() {
    for seed in 0..40 {
        let outcome = run_seed(seed, Options::default());
        assert!(
            outcome.violations.is_empty(),
            "seed {seed}: {:?}",
            outcome.violations
        );
    }
}
