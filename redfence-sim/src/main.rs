//! `redfence-sim`: runs seeds of the deterministic simulation.
//!
//! ```text
//! redfence-sim --seeds N --first-seed S [--plant NAME] [--profile P] [--jobs J]
//! redfence-sim --seed S --trace [--plant NAME] [--profile P]
//! ```
//!
//! Plants (historical bugs put back): `shortening-extend`, `release-overtakes-acquire`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use redfence::testing::{Plant, Profile};
use redfence_sim::{Options, Outcome, run_seed};

const USAGE: &str = "usage: redfence-sim --seeds N --first-seed S [--plant NAME] [--profile P] [--jobs J]\n       \
                     redfence-sim --seed S --trace [--plant NAME] [--profile P]\n\
                     plants: shortening-extend, release-overtakes-acquire\n\
                     profiles: redis7, valkey9, redis8 (by default each seed draws one)";

/// What the command line asks for.
struct Args {
    seeds: u64,
    first: u64,
    trace: bool,
    plant: Option<Plant>,
    profile: Option<Profile>,
    jobs: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 1,
        first: 0,
        trace: false,
        plant: None,
        profile: None,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut words = std::env::args().skip(1);
    let number = |word: Option<String>, flag: &str| -> Result<u64, String> {
        word.as_deref()
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("{flag} takes a number"))
    };
    while let Some(word) = words.next() {
        match word.as_str() {
            "--seeds" => args.seeds = number(words.next(), "--seeds")?,
            "--first-seed" | "--seed" => args.first = number(words.next(), &word)?,
            "--trace" => args.trace = true,
            "--jobs" => args.jobs = number(words.next(), "--jobs")?.max(1) as usize,
            "--plant" => {
                args.plant = Some(match words.next().as_deref() {
                    Some("shortening-extend") => Plant::ShorteningExtend,
                    Some("release-overtakes-acquire") => Plant::ReleaseOvertakesAcquire,
                    other => return Err(format!("unknown plant {other:?}")),
                });
            }
            "--profile" => {
                args.profile = Some(match words.next().as_deref() {
                    Some("redis7") => Profile::Redis7,
                    Some("valkey9") => Profile::Valkey9,
                    Some("redis8") => Profile::Redis8,
                    other => return Err(format!("unknown profile {other:?}")),
                });
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.trace {
        args.seeds = 1;
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(err) => {
            if !err.is_empty() {
                eprintln!("redfence-sim: {err}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.trace {
        let outcome = run_seed(
            args.first,
            Options {
                plant: args.plant,
                trace: true,
                profile: args.profile,
            },
        );
        for line in &outcome.trace {
            println!("{line}");
        }
        for violation in &outcome.violations {
            println!("VIOLATION: {violation}");
        }
        return if outcome.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    explore(&args)
}

/// Runs `args.seeds` seeds from `args.first` on `args.jobs` threads.
fn explore(args: &Args) -> ExitCode {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let failed: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let totals = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let bar = std::io::stderr().is_terminal();
    let options = Options {
        plant: args.plant,
        trace: false,
        profile: args.profile,
    };
    std::thread::scope(|scope| {
        for _ in 0..args.jobs {
            let (next, failed, totals) = (&next, &failed, &totals);
            scope.spawn(move || {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= args.seeds {
                        break;
                    }
                    let outcome = run_seed(args.first + k, options);
                    totals[0].fetch_add(1, Ordering::Relaxed);
                    totals[1].fetch_add(outcome.grants, Ordering::Relaxed);
                    totals[2].fetch_add(outcome.faults, Ordering::Relaxed);
                    if !outcome.violations.is_empty() {
                        failed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(outcome);
                    }
                    let done = totals[0].load(Ordering::Relaxed);
                    if bar && (done % 25 == 0 || done == args.seeds) {
                        let width = 40;
                        let filled = (done * width / args.seeds.max(1)) as usize;
                        eprint!(
                            "\r[{}{}] {done}/{}",
                            "#".repeat(filled),
                            " ".repeat(width as usize - filled),
                            args.seeds
                        );
                        let _ = std::io::stderr().flush();
                    }
                }
            });
        }
    });
    if bar {
        eprintln!();
    }
    let mut failed = std::mem::take(&mut *failed.lock().unwrap_or_else(PoisonError::into_inner));
    failed.sort_by_key(|outcome| outcome.seed);
    let violations: usize = failed.iter().map(|o| o.violations.len()).sum();
    for outcome in &failed {
        for violation in &outcome.violations {
            println!("seed {}: {violation}", outcome.seed);
        }
    }
    if let Some(first) = failed.first() {
        println!(
            "first failing seed: {} ({} seeds from {}); replay: redfence-sim --seed {} --trace{}",
            first.seed,
            first.seed - args.first + 1,
            args.first,
            first.seed,
            replay_flags(args)
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "sim: {} seeds, {violations} violations, {} acquisitions, {} faults, {:.0} seeds/s",
        totals[0].load(Ordering::Relaxed),
        totals[1].load(Ordering::Relaxed),
        totals[2].load(Ordering::Relaxed),
        totals[0].load(Ordering::Relaxed) as f64 / seconds.max(1e-9)
    );
    if violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The flags that replay a seed of this run: its plant and its profile.
fn replay_flags(args: &Args) -> String {
    let plant = match args.plant {
        Some(Plant::ShorteningExtend) => " --plant shortening-extend",
        Some(Plant::ReleaseOvertakesAcquire) => " --plant release-overtakes-acquire",
        _ => "",
    };
    let profile = match args.profile {
        Some(Profile::Redis7) => " --profile redis7",
        Some(Profile::Valkey9) => " --profile valkey9",
        Some(Profile::Redis8) => " --profile redis8",
        _ => "",
    };
    format!("{plant}{profile}")
}
