//! `redfence`: run a command under a Redlock (`run`), see who holds a lock (`status`), break
//! one (`release --force`).
//!
//! ```sh
//! cargo install --path redfence-cli        # from a checkout of the workspace
//! export REDFENCE_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379
//! redfence run -r nightly-invoices --fencing postgres://app@10.0.0.9/app -- ./send-invoices
//! redfence status --json nightly-invoices
//! redfence release --force nightly-invoices
//! ```
//!
//! The package `redfence-cli` of the redfence workspace: it uses `redfence` for the locks and
//! `redfence-postgres` for `--fencing postgres://…`. Features `tls-rustls` and
//! `tls-native-tls` enable redfence's TLS for `rediss://` nodes and counters.
#![forbid(unsafe_code)]

mod args;
mod child;
mod exit;
mod logging;
mod release;
mod run;
mod setup;
mod signals;
mod status;
mod tree;
mod waiting;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, Command};
use crate::exit::Failure;

fn main() -> ExitCode {
    // First of all: the job, and any process of the same user, must not read the node URLs
    // (their passwords) from this process's environment or memory in /proc.
    let undumpable = not_dumpable();
    let matches = match Cli::command().try_get_matches() {
        Ok(matches) => matches,
        Err(err) => return usage_error(&err),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    logging::init(cli.common.verbose, cli.common.quiet);
    if let Err(err) = undumpable {
        tracing::warn!(
            %err,
            "cannot make redfence undumpable: the job may read its environment in /proc"
        );
    }
    if matches.value_source("nodes") == Some(ValueSource::CommandLine)
        && cli.common.nodes.iter().any(|url| has_password(url))
    {
        tracing::warn!(
            "a password given with --nodes on the command line is visible to every user of \
             this machine (ps, /proc/<pid>/cmdline): set REDFENCE_NODES or use --nodes-file"
        );
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return fail(Failure::new(exit::SOFTWARE, format!("no runtime: {err}"))),
    };
    match runtime.block_on(dispatch(&cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => fail(failure),
    }
}

async fn dispatch(cli: &Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Run(args) => run::run(&cli.common, args).await,
        Command::Status(args) => {
            let redlock = setup::build(setup::builder(&cli.common)?)?;
            let outcome = status::status(&redlock, args).await;
            setup::close(&redlock, cli.common.node_timeout).await;
            outcome
        }
        Command::Release(args) => {
            let redlock = setup::build(setup::builder(&cli.common)?)?;
            let outcome = release::release(&redlock, args).await;
            setup::close(&redlock, cli.common.node_timeout).await;
            outcome
        }
    }
}

/// Makes this process not dumpable (Linux: `prctl(PR_SET_DUMPABLE, 0)`): its
/// `/proc/<pid>/environ`, `mem` and the like then belong to root, so that the job, run as the
/// same user, cannot read the node URLs from them. Its `cmdline` stays readable by everyone,
/// hence the warning about `--nodes` on a command line. No core dump is written either. The
/// job itself is dumpable again: an `execve` resets the flag.
#[cfg(target_os = "linux")]
fn not_dumpable() -> nix::Result<()> {
    nix::sys::prctl::set_dumpable(false)
}

/// Elsewhere than Linux: nothing to do through this interface.
#[cfg(not(target_os = "linux"))]
fn not_dumpable() -> Result<(), std::convert::Infallible> {
    Ok(())
}

/// Whether a node URL carries a password: `scheme://[user]:password@host...`.
fn has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty())
}

/// Prints the failure's one line (unless it was logged already) and returns its code.
fn fail(failure: Failure) -> ExitCode {
    if !failure.message.is_empty() {
        eprintln!("redfence: {}", failure.message);
    }
    ExitCode::from(failure.code)
}

/// `--help` and `--version` print and exit 0; any other parse error is one line, exit 64.
fn usage_error(err: &clap::Error) -> ExitCode {
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = err.print();
        return ExitCode::from(exit::USAGE);
    }
    let rendered = err.render().to_string();
    // The first paragraph (e.g. "the following required arguments were not provided:" and
    // the list), on one line.
    let line = rendered
        .lines()
        .map(str::trim)
        .skip_while(|line| line.is_empty())
        .take_while(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let line = line.trim_start_matches("error: ");
    let line = if line.is_empty() {
        "invalid command line"
    } else {
        line
    };
    fail(Failure::usage(format!("{line} (see --help)")))
}

#[cfg(test)]
mod tests {
    use super::has_password;

    #[test]
    fn a_password_in_a_node_url_is_seen() {
        assert!(has_password("redis://:s3cret@10.0.0.1:6379"));
        assert!(has_password("rediss://app:s3cret@host:6380/2"));
        assert!(!has_password("redis://app@host:6379"));
        assert!(!has_password("redis://host:6379/0"));
        assert!(!has_password("redis://:@host:6379"));
        assert!(!has_password("redis+unix:///run/redis.sock?db=1"));
    }
}
