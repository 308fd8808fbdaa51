//! Human-readable logs on stderr: `-q` errors only, default warnings plus redfence's own
//! progress, `-v` debug, `-vv` trace; `RUST_LOG` overrides all of them.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber for the verbosity asked for.
pub fn init(verbose: u8, quiet: bool) {
    let default = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn,redfence=info",
        (false, 1) => "info,redfence=debug",
        (false, _) => "debug,redfence=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A second subscriber cannot be installed; there is none before this one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
